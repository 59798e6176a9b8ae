"""Consistency rate: the share of completions whose stated final answer is the one their own
reasoning leads to (DESIGN.md, "Metrics"). Two measurements, each logged under its own name:

* **re-derivation** (``consistency/rederive_rate``) — cut the completion just before its stated
  answer (keeping the answer marker: ``#### ``, ``\\boxed{``, ``<answer>``), let a judge model finish
  greedily from prompt + reasoning, extract the judge's answer the same way and compare it with the
  stated one (the benchmark's notion of "same answer": math-verify for math). Consistent = equal.
* **likelihood** (``consistency/likelihood_mean``, ``consistency/likelihood_rate``) — the judge's
  probability of the stated answer tokens given prompt + reasoning, exp(mean token log-prob); the
  confidence signal of GRPO-CARE ("Consistency-Aware RL for Multimodal Reasoning", 2025), computed by
  ``rlexp.rewards.likelihood.answer_confidence``. The rate is the share above ``threshold``.

The judge is a frozen reference model (``judge: reference``: in training a frozen copy of the
initial policy — the algorithm's own frozen reference when it keeps one; in ``rlexp eval`` the base
model of the ``model`` group when a checkpoint is evaluated) or the policy itself (``judge: policy``).

A completion without an answer in the prompt's format cannot be measured: it counts as inconsistent
in both rates and is counted separately (``consistency/no_answer_frac``). ``likelihood_mean`` is the
mean over completions that state an answer.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable

import torch

from rlexp.rewards.answers import answer_span
from rlexp.rewards.likelihood import answer_confidence

JUDGES = ("reference", "policy")


def first_answer(cut: str, continuation: str) -> str:
    """``cut + continuation`` up to the end of the first answer the judge writes at the cut (a judge
    that goes on to state another answer is held to its first one): the rest of the ``####`` line,
    up to the brace closing ``\\boxed{``, or up to ``</answer>``."""
    tail = cut.rstrip()
    if tail.endswith("####"):
        return cut + continuation.split("\n", 1)[0]
    if tail.lower().endswith("<answer>"):
        end = continuation.lower().find("</answer>")
        return cut + (continuation[: end + len("</answer>")] if end >= 0 else continuation)
    if tail.endswith("{"):
        depth = 1
        for j, ch in enumerate(continuation):
            depth += (ch == "{") - (ch == "}")
            if depth == 0:
                return cut + continuation[: j + 1]
    return cut + continuation


class ConsistencyMeter:
    def __init__(
        self,
        rederive: bool = True,
        likelihood: bool = True,
        judge: str = "reference",
        threshold: float = 0.5,
        max_new_tokens: int = 16,
        max_completions: int | None = None,
        batch_size: int = 16,
        enabled: bool = True,
    ):
        if judge not in JUDGES:
            raise ValueError(f"consistency.judge={judge!r} is not one of {JUDGES}")
        if not 0.0 <= threshold <= 1.0:
            raise ValueError(f"consistency.threshold={threshold} must be in [0, 1]")
        if max_new_tokens <= 0:
            raise ValueError(f"consistency.max_new_tokens={max_new_tokens} must be > 0")
        if not (rederive or likelihood):
            raise ValueError("consistency: both rederive and likelihood are off; set consistency.enabled=false instead")
        self.rederive, self.likelihood, self.judge = rederive, likelihood, judge
        self.threshold, self.max_new_tokens = threshold, max_new_tokens
        self.max_completions, self.batch_size = max_completions, batch_size
        self.reference_model = None

    # ---- which model judges --------------------------------------------------------------------
    def bind(self, policy, reference=None) -> None:
        """Training: judge with the algorithm's frozen reference if it keeps one, else with a frozen
        copy of ``policy`` as it is now (the initial policy)."""
        if self.judge != "reference":
            return
        from rlexp.models.peft import AdaptersOff

        # a LoRA run's reference is the policy with its adapters off, a forward-only view: the judge also generates
        shared = reference is not None and getattr(reference, "kind", None) == "frozen" and reference.model is not None
        if shared and not isinstance(reference.model, AdaptersOff):
            self.reference_model = reference.model
        else:
            self.reference_model = copy.deepcopy(policy).eval().requires_grad_(False)

    def judge_model(self, policy):
        if self.judge == "policy":
            return policy
        if self.reference_model is None:
            raise RuntimeError("consistency.judge=reference but no reference model is bound (ConsistencyMeter.bind)")
        return self.reference_model

    # ---- measuring -----------------------------------------------------------------------------
    @torch.no_grad()
    def measure(
        self,
        policy,
        tokenizer,
        prompts: list[str],
        completions: list[str],
        answer_format: str,
        extract: Callable[[str], str | None],
        equivalent: Callable[[str, str, int], bool],
        rollout=None,
    ) -> tuple[dict[str, float], list[dict]]:
        """Metrics and one dict per measured completion (``stated``, ``rederived``,
        ``rederive_consistent``, ``likelihood``). ``extract(text)`` gives the answer stated in the
        prompt's format; ``equivalent(a, b, i)`` compares two answers of completion ``i``."""
        n = len(completions) if self.max_completions is None else min(len(completions), self.max_completions)
        prompts, completions = prompts[:n], completions[:n]
        judge = self.judge_model(policy)
        per = [{"stated": None} for _ in range(n)]
        spans = [answer_span(c, answer_format) for c in completions]
        has = []
        for i, (c, sp) in enumerate(zip(completions, spans)):
            stated = extract(c) if sp is not None else None
            per[i]["stated"] = stated
            if stated is not None:
                has.append(i)
        m: dict[str, float] = {
            "consistency/measured": float(n),
            "consistency/no_answer_frac": (n - len(has)) / n if n else float("nan"),
        }
        if self.rederive:
            consistent = 0
            if has:
                from rlexp.rollout.hf import HFRollout

                gen = rollout or HFRollout(max_new_tokens=self.max_new_tokens)
                cut = [completions[i][: spans[i][0]].rstrip(" \t") for i in has]  # the judge writes its own space
                texts: list[str] = []
                for k in range(0, len(has), self.batch_size):
                    chunk = has[k : k + self.batch_size]
                    out = gen.generate(
                        judge,
                        tokenizer,
                        [prompts[i] + cut[k + j] for j, i in enumerate(chunk)],
                        1,
                        greedy=True,
                        max_new_tokens=self.max_new_tokens,
                    )
                    texts.extend(out.texts)
                for j, i in enumerate(has):
                    rederived = extract(first_answer(cut[j], texts[j]))
                    ok = rederived is not None and (
                        rederived == per[i]["stated"] or equivalent(per[i]["stated"], rederived, i)
                    )
                    per[i].update(rederived=rederived, rederive_continuation=texts[j], rederive_consistent=bool(ok))
                    consistent += int(ok)
            for i in range(n):
                per[i].setdefault("rederive_consistent", False)
            m["consistency/rederive_rate"] = consistent / n if n else float("nan")
        if self.likelihood:
            conf = (
                answer_confidence(
                    judge,
                    tokenizer,
                    [prompts[i] for i in has],
                    [completions[i] for i in has],
                    answer_format,
                    self.batch_size,
                )
                if has
                else torch.zeros(0)
            )
            vals = []
            for j, i in enumerate(has):
                v = float(conf[j])
                per[i]["likelihood"] = None if math.isnan(v) else v
                if not math.isnan(v):
                    vals.append(v)
            for i in range(n):
                per[i].setdefault("likelihood", None)
            m["consistency/likelihood_mean"] = sum(vals) / len(vals) if vals else float("nan")
            m["consistency/likelihood_rate"] = sum(v > self.threshold for v in vals) / n if n else float("nan")
        return m, per

    def batch_metrics(self, policy, tokenizer, batch, answer_format: str) -> dict[str, float]:
        """Per-step training metrics over a rollout batch (its prompts, completions and records)."""
        from rlexp.evaluation.checkers import AnswerChecker, AnswerExtractor

        extractor, checker = AnswerExtractor(answer_format), AnswerChecker()
        records = batch.records
        metrics, _ = self.measure(
            policy,
            tokenizer,
            batch.prompts,
            batch.completions,
            answer_format,
            extractor.strict,
            lambda a, b, i: checker.equivalent(a, b, records[i]),
        )
        return metrics


def meter_from_config(node) -> ConsistencyMeter | None:
    """A ``ConsistencyMeter`` from the ``consistency`` config node, or None when it is disabled."""
    from omegaconf import OmegaConf

    values = OmegaConf.to_container(node, resolve=True) if not isinstance(node, dict) else dict(node)
    if not values.get("enabled", False):
        return None
    return ConsistencyMeter(**values)
