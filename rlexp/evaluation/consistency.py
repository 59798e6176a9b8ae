"""Consistency rate: the share of completions whose stated final answer is the one their own
reasoning leads to (DESIGN.md, "Metrics"). Two measurements, each logged under its own name:

* **re-derivation** (``consistency/rederive_rate``) — cut the completion just before its stated
  answer (keeping the answer marker: ``#### ``, ``\\boxed{``, ``<answer>``), let a judge model finish
  greedily from prompt + reasoning, extract the judge's answer the same way and compare it with the
  stated one (the benchmark's notion of "same answer": math-verify for math). Consistent = equal.
* **option shuffle** (``consistency/shuffle_rate``, opt-in: ``shuffle``) — for multiple-choice records (the
  multiple-choice view, GPQA: ``metadata.options``): re-ask the question with every option moved to another letter
  (``rlexp.data.multiple_choice.reshuffle``), keep the completion's reasoning, let the judge finish greedily and
  compare the chosen option's content with the one first chosen (ACRE, "Answer-Consistent Chain-of-thought
  Reinforcement Learning", 2025: a reasoning that supports an option picks it again wherever its letter went).
  The rate is over the multiple-choice completions (``consistency/shuffle_measured``); other rows are left out.
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

import math
from collections.abc import Callable

import torch

from rlexp.models.copies import weights_copy
from rlexp.rewards.answers import answer_span, first_answer
from rlexp.rewards.likelihood import answer_confidence
from rlexp.rewards.option_shuffle import shuffle_recheck

JUDGES = ("reference", "policy")


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
        shuffle: bool = False,
    ):
        if judge not in JUDGES:
            raise ValueError(f"consistency.judge={judge!r} is not one of {JUDGES}")
        if not 0.0 <= threshold <= 1.0:
            raise ValueError(f"consistency.threshold={threshold} must be in [0, 1]")
        if max_new_tokens <= 0:
            raise ValueError(f"consistency.max_new_tokens={max_new_tokens} must be > 0")
        if not (rederive or likelihood or shuffle):
            raise ValueError(
                "consistency: rederive, likelihood and shuffle are all off; set consistency.enabled=false instead"
            )
        self.rederive, self.likelihood, self.shuffle, self.judge = rederive, likelihood, shuffle, judge
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
            self.reference_model = weights_copy(policy).eval().requires_grad_(False)

    def judge_model(self, policy):
        if self.judge == "policy":
            return policy
        if self.reference_model is None:
            raise RuntimeError("consistency.judge=reference but no reference model is bound (ConsistencyMeter.bind)")
        return self.reference_model

    # ---- measuring -----------------------------------------------------------------------------
    def _continue(self, judge, tokenizer, texts: list[str], rollout=None) -> list[str]:
        """The judge's greedy continuations of ``texts`` (``max_new_tokens`` each, ``batch_size`` at a time)."""
        from rlexp.rollout.hf import HFRollout

        gen = rollout or HFRollout(max_new_tokens=self.max_new_tokens)
        out: list[str] = []
        for k in range(0, len(texts), self.batch_size):
            chunk = texts[k : k + self.batch_size]
            out.extend(gen.generate(judge, tokenizer, chunk, 1, greedy=True, max_new_tokens=self.max_new_tokens).texts)
        return out

    def _shuffle_rate(self, judge, tokenizer, prompts, completions, per, records, answer_format, extract, rollout):
        """``consistency/shuffle_rate`` over the multiple-choice rows (see the module docstring)."""
        checks = shuffle_recheck(
            prompts,
            completions,
            records,
            answer_format,
            extract,
            lambda t: self._continue(judge, tokenizer, t, rollout),
        )
        measured = [c for c in checks if c is not None]
        if not measured:
            return {}
        for p, c in zip(per, checks):
            if c is not None:
                p.update(shuffle_letter=c.again_letter, shuffle_option=c.again_option, shuffle_consistent=c.consistent)
        rate = sum(c.consistent for c in measured) / len(measured)
        return {"consistency/shuffle_rate": rate, "consistency/shuffle_measured": float(len(measured))}

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
        records: list[dict] | None = None,
    ) -> tuple[dict[str, float], list[dict]]:
        """Metrics and one dict per measured completion (``stated``, ``rederived``,
        ``rederive_consistent``, ``likelihood``, ``shuffle_consistent``). ``extract(text)`` gives the answer stated
        in the prompt's format; ``equivalent(a, b, i)`` compares two answers of completion ``i``; ``records``
        (one per completion) are what the option-shuffle rate reads its options from."""
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
                cut = [completions[i][: spans[i][0]].rstrip(" \t") for i in has]  # the judge writes its own space
                texts = self._continue(judge, tokenizer, [prompts[i] + cut[j] for j, i in enumerate(has)], rollout)
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
        if self.shuffle and records is not None:
            m.update(
                self._shuffle_rate(
                    judge, tokenizer, prompts, completions, per, records[:n], answer_format, extract, rollout
                )
            )
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
            records=records,
        )
        return metrics


def meter_from_config(node) -> ConsistencyMeter | None:
    """A ``ConsistencyMeter`` from the ``consistency`` config node, or None when it is disabled."""
    from omegaconf import OmegaConf

    values = OmegaConf.to_container(node, resolve=True) if not isinstance(node, dict) else dict(node)
    if not values.get("enabled", False):
        return None
    return ConsistencyMeter(**values)
