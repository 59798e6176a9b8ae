"""Plain reward functions as reward terms: TRL's reward-function convention and one-sample functions.

A TRL reward function (``GRPOTrainer(reward_funcs=[fn])``) is called once per batch as
``fn(prompts=..., completions=..., completion_ids=..., **columns)``: every dataset column but the prompt
arrives as a list with one entry per completion, and it returns one float (or ``None``: "does not apply",
which TRL turns into NaN and leaves out of the sum) per completion. ``FunctionReward`` calls such a
function the same way, so TRL's functions (``trl.rewards.accuracy_reward``, the ``reward_len`` of its docs)
work unchanged; ``None`` scores 0 here, the same contribution to the weighted sum as TRL's nansum, and is
recorded as missing: a row that every term failed or left missing is "unscored" (``batch.extras["unscored"]``),
which ``algorithm.unscored_rows=exclude`` leaves out of the advantage's statistics as TRL does.

A function whose one parameter is a ``Sample`` (``def my_reward(sample) -> float``) is called per sample,
as ``RewardTerm.score`` is. In a config, name the function itself::

    reward:
      terms:
        length:
          _target_: my_rewards.reward_len     # a module in the working directory, or any import path
          weight: 0.1

``rlexp.runs.training`` wraps a target that is a plain function in ``FunctionReward``; the explicit form
(``_target_: rlexp.rewards.functions.FunctionReward``, ``function: my_rewards.reward_len``) adds options.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import logging
from collections.abc import Callable

from rlexp.core.registry import REWARDS
from rlexp.rewards.terms import RewardTerm, Sample, TermResult

log = logging.getLogger(__name__)

COMPLETION_FORMATS = ("standard", "conversational")


def resolve_function(function: str | Callable) -> Callable:
    """A callable, or the callable an import path (``package.module.name``) names."""
    if callable(function):
        return function
    module, _, name = str(function).rpartition(".")
    if not module:
        raise ValueError(f"reward function {function!r}: expected an import path such as my_rewards.reward_len")
    try:
        fn = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as e:
        raise ValueError(
            f"reward function {function!r} cannot be imported ({e}); a module in the working directory is "
            "importable when rlexp runs from that directory"
        ) from e
    if not callable(fn):
        raise ValueError(f"reward function {function!r} is not callable")
    return fn


def is_per_sample(fn: Callable) -> bool:
    """True for ``fn(sample)``: one required positional parameter and none of TRL's keywords."""
    params = inspect.signature(fn).parameters.values()
    if any(p.kind == p.VAR_KEYWORD or p.name in ("completions", "prompts") for p in params):
        return False
    required = [p for p in params if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return len(required) == 1


@REWARDS.register
class FunctionReward(RewardTerm):
    """A reward term from a plain function (see the module docstring).

    ``completion_format``: ``standard`` passes prompts and completions as strings; ``conversational``
    passes TRL's message lists (``[{"role": "assistant", "content": ...}]``; prompts as the user message), as
    TRL does for a conversational dataset. ``columns`` renames record fields for the function
    (``{solution: answer}`` hands our ``answer`` to a function reading TRL's ``solution`` column);
    ``kwargs`` are fixed keyword arguments."""

    def __init__(
        self,
        function: str | Callable,
        weight: float = 1.0,
        completion_format: str = "standard",
        columns: dict[str, str] | None = None,
        kwargs: dict | None = None,
    ):
        super().__init__(weight)
        if completion_format not in COMPLETION_FORMATS:
            raise ValueError(f"completion_format={completion_format!r} is not one of {list(COMPLETION_FORMATS)}")
        self.fn = resolve_function(function)
        self.name = getattr(self.fn, "__name__", type(self.fn).__name__)
        self.completion_format = completion_format
        self.columns, self.kwargs = dict(columns or {}), dict(kwargs or {})
        self.per_sample = is_per_sample(self.fn)

    def score(self, sample: Sample) -> float:
        return float(self.fn(sample))

    def __call__(self, samples: list[Sample]) -> TermResult:
        if self.per_sample:
            return super().__call__(samples)
        if not samples:
            return TermResult([], [])
        try:
            out = self.fn(**self.trl_kwargs(samples))
            if inspect.isawaitable(out):  # TRL accepts async reward functions too
                out = asyncio.run(out)
            out = list(out)
        except Exception as e:  # the whole batch failed: every sample recorded, the run goes on
            log.warning("reward function %s failed on a batch of %d: %r", self.name, len(samples), e)
            return TermResult([0.0] * len(samples), [True] * len(samples))
        if len(out) != len(samples):
            raise ValueError(
                f"reward function {self.name} returned {len(out)} rewards for {len(samples)} completions "
                "(one per completion expected)"
            )
        return TermResult(
            [0.0 if r is None else float(r) for r in out], [False] * len(samples), [r is None for r in out]
        )

    def trl_kwargs(self, samples: list[Sample]) -> dict:
        """TRL's call: prompts, completions, completion ids (when known) and every record column as a list."""
        if self.completion_format == "conversational":
            prompts = [[{"role": "user", "content": s.prompt}] for s in samples]
            completions = [[{"role": "assistant", "content": s.completion}] for s in samples]
        else:
            prompts, completions = [s.prompt for s in samples], [s.completion for s in samples]
        kwargs = {"prompts": prompts, "completions": completions}
        if all(s.completion_ids is not None for s in samples):
            kwargs["completion_ids"] = [list(s.completion_ids) for s in samples]
        keys = dict.fromkeys(k for s in samples for k in s.record if k not in ("prompt", "completion"))
        kwargs.update({k: [s.record.get(k) for s in samples] for k in keys})
        kwargs.update({new: [s.record.get(old) for s in samples] for new, old in self.columns.items()})
        return {**kwargs, **self.kwargs}
