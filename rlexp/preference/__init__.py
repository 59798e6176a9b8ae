"""Offline and online preference methods run through TRL's own trainers inside our run (issue 24): DPO (with TRL's
loss types, IPO among them), KTO, ORPO and online DPO (``algorithm.backend: trl``). ``pairs`` makes preference
pairs from scored groups, ``own_rollouts`` the default data (pairs from our own rollouts), ``data`` the preference
sets (local files, hub), ``metrics`` TRL's log names in ours, ``method`` the algorithm node, ``runner`` the run."""
