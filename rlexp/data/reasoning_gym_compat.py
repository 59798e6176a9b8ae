"""The one way rlexp imports reasoning-gym: ``import_reasoning_gym()``, which returns the ``reasoning_gym`` module.

reasoning-gym 0.1.25 requires pycosat, which has no wheel on PyPI (any version), so pip would compile its C sdist.
rlexp installs reasoning-gym with ``--no-deps`` (README set-up) and declares its other requirements itself
(pyproject.toml); ``import reasoning_gym`` still imports pycosat (the zebra-puzzle task registers at import). When the
real pycosat is not importable, ``rlexp.data.pycosat_compat`` (pycosat's API on PySAT, a wheel) is registered as
``sys.modules["pycosat"]`` first; where pycosat is installed it is used as is.

Here, in ``rlexp.data`` (whose ``__init__`` imports nothing), because every user sits above it: the data sources,
the reward terms' scorers (``rlexp.rewards.terms``), the benchmarks (``rlexp.evaluation.sources``) and GEM
(``rlexp.environments.gem``); this module imports nothing of rlexp.
"""

from __future__ import annotations

import importlib
import sys

REASONING_GYM = "reasoning-gym==0.1.25"
INSTALL = f"pip install --no-deps {REASONING_GYM}"


def install_pycosat_adapter() -> bool:
    """Register ``rlexp.data.pycosat_compat`` as ``pycosat`` unless the real one imports; True if it did."""
    try:
        import pycosat  # noqa: F401
    except ImportError:
        pass
    else:
        return False
    try:
        adapter = importlib.import_module("rlexp.data.pycosat_compat")
    except ImportError as e:
        raise ImportError(
            "reasoning-gym needs pycosat (no wheel on PyPI) or python-sat for rlexp's stand-in: "
            "pip install -e . (python-sat is a dependency of rlexp)"
        ) from e
    sys.modules["pycosat"] = adapter
    return True


def import_reasoning_gym():
    """The ``reasoning_gym`` module, with pycosat's stand-in registered first where pycosat is missing."""
    if (module := sys.modules.get("reasoning_gym")) is not None:
        return module
    install_pycosat_adapter()
    try:
        return importlib.import_module("reasoning_gym")
    except ModuleNotFoundError as e:
        if e.name != "reasoning_gym":
            raise
        raise ModuleNotFoundError(
            f"reasoning-gym is not installed: {INSTALL} (README set-up; its other requirements are rlexp's own)",
            name="reasoning_gym",
        ) from e
