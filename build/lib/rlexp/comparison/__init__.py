"""Comparing runs (``rlexp compare``): put runs side by side, aggregated over seeds.

Runs come from MLflow (``--tracking-uri``, ``--experiment``, ``--tag key=value``, ``--filter`` with
MLflow's search syntax) or from run directories (``--runs DIR``: each ``metrics.jsonl`` below DIR).
Runs are grouped by their identity tags except the seed (``--group-by``, default
algorithm,dataset,model,benchmark; ``params.<key>`` groups by a config value). Per run a metric's
value is its last logged value (the mean of the last ``--last K`` values); per group, the mean ±
sample standard deviation over its runs.

Output (the results/ format, written to ``--out``, file names prefixed by ``--name``):

* ``<name>.md`` — the command, the table (``mean ± std`` cells, ``n`` runs, their seeds), the runs
  with their ids and git commits, and the curve plots;
* ``<name>.csv`` — one row per group: group columns, ``n``, ``seeds``, ``<metric>_mean``, ``<metric>_std``;
* ``<name>_runs.csv`` — one row per run: id, name, source, tags, one column per metric;
* ``<name>_<metric>.png`` — the learning curve of each metric: mean over seeds per step with a ±std
  band, one line per group.

The table is also printed to the terminal. Metrics (``--metrics``, names or regular expressions)
default to whichever of reward, accuracy, entropy, length, consistency and pass@k exist.
"""
