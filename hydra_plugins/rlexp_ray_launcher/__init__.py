"""rlexp's Ray launcher for Hydra (``hydra/launcher=rlexp_ray``): each job a Ray task on a local or existing Ray
cluster. Hydra's plugin discovery imports this package on every run, so nothing here imports Ray at module level;
Ray is the ``cluster`` extra (``pip install -e '.[cluster]'``)."""
