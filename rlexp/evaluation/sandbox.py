"""The sandbox moved to ``rlexp.execution.sandbox`` (the code reward uses it too, and ``rlexp.rewards`` sits below
``rlexp.evaluation``); this module re-exports it so that ``from rlexp.evaluation.sandbox import run_python`` keeps
working."""

from rlexp.execution.sandbox import (  # noqa: F401
    CLONE_NEWNET,
    CLONE_NEWUSER,
    ChildResult,
    ExecResult,
    network_isolation,
    run_child,
    run_many,
    run_python,
)
