"""Where the package's config tree lives: ``rlexp/conf`` (package data, so a built wheel carries it).

The top-level ``conf`` of a source checkout is a symlink to this folder, not a second copy. A user's
own config directory goes on Hydra's search path with ``--config-dir <dir>`` (or
``hydra.searchpath=[file://<dir>]``); its groups then add to (and override) these.
"""

from __future__ import annotations

from pathlib import Path

from rlexp.config.schema import register

CONF_DIR = str(Path(__file__).resolve().parent.parent / "conf")

# the tree's defaults lists name the structured-config schemas (``rlexp_schema``, ``rlexp_eval_schema``):
# whoever composes from CONF_DIR needs them in Hydra's ConfigStore
register()
