"""One policy as solver and as its own verifier, judge or referee (issue 23): group stages that, after the run's rollout
is scored, prompt the policy to judge its own solutions, reward each judgment against the rule verifier's outcome and
train the judgment rows in the same update as the solutions.

Three methods share the machinery (the judge prompts, their sampling, their parsing, the assembled batch):

* ``SelfVerification`` — RISE, "Trust, But Verify: A Self-Verification Approach to Reinforcement Learning with
  Verifiable Rewards" (Liu et al., 2025; arXiv 2505.13445; released code xyliu-cs/RISE with its verl fork
  xyliu-cs/verl: ``verl/trainer/ppo/ray_trainer.py`` ``online_critique``, ``verl/utils/critique_utils.py``,
  ``critique_templates.py``, ``verl_utils/reward/reward_func*.py``). Each step, ``verify_share`` × (the step's groups)
  solutions (the release: ``critique_batch_size`` 128 of 1024 prompts) are drawn, spread over the groups (verl's
  ``downsampling``: an equal share per group, the remainder one more in some groups, rows drawn at random). Each is
  shown to the policy with its problem (the verification prompt, the release's system prompt) and ``samples`` replies
  are sampled (the release: the rollout's n), one group per verification prompt. The verification target is the
  solution's outcome score r_o under the rule verifier: 1 correct, −0.5 wrong, −1 without a stated final answer (the
  release's reward_func: boxed and matched / boxed / unboxed); the reply's verdict is its last ``\\boxed{v}``.
  Verification reward (the release's ver_reward_func on the verdict): 1 if v = r_o, −0.5 if v differs or is not a
  number in [−1, 1], −1 without a ``\\boxed{}`` (a parse failure, counted). Solutions keep the run's reward terms.
* ``RecycledJudging`` — SPARK, "SPARK: Synergistic Policy And Reward Co-Evolving Framework" (Liu et al., 2025; arXiv
  2509.22624; released code InternLM/Spark: ``Lmm_XC/openrlhf/trainer/ppo_utils/new_data_gen.py``,
  ``prompt_templates*.py``, ``ppo_trainer.py``, ``XC/rm_fn/math_verify_2.py``). The rule-verified rollouts are
  recycled into judge items, at most one per group: a group all correct or all wrong gives a pointwise item (is this
  answer correct? Yes/No; all correct: its first answer, all wrong: a random one); a mixed group a pointwise item on a
  random correct or wrong answer with probability ``pointwise_prob`` (0.3), else a pairwise item (a correct and a
  wrong answer in random order: which is correct? A/B). Reflection items: for the first ``reflection_cot_share`` of
  the groups with a wrong answer, a wrong solution's whole reasoning ("judge this reasoning; if wrong, solve it
  again"), for the rest a wrong stated answer; reflection items are questions in the run's prompt format, scored by
  the run's own terms against the record's ground truth. At most ``judge_share`` / ``reflection_share`` × groups
  items of each kind (the release: 32 each per 64 prompts). Each item is sampled ``samples`` times (the release: 8),
  one group per item. Judge reward (math_verify_2 on the boxed verdict): 1 if the verdict equals the label, else 0.
* ``SelfReferee`` — URPO, "URPO: A Unified Reward & Policy Optimization Framework for Large Language Models" (Lu et
  al., 2025; arXiv 2507.17515; no released code found; only the abstract and a summary of the method were readable:
  one GRPO loop over mixed data — verifiable problems, preference data as N-way ranking, open-ended instructions that
  the model scores itself). For every group the policy, as referee, scores all G responses at once (an N-way scoring,
  "Scores: s1, ..., sG" on 1–10), ``samples`` referee replies per group. On a group with a ground truth the referee
  rows train, rewarded by the agreement of their (normalised) scores with the rule's labels; on an open group (a
  record without ground truth, or one of the ``open_share`` of the groups whose label is hidden, standing in for the
  open-ended instructions of the paper) the referee rows do not train and the players' reward is the referee's:
  the mean normalised score of its row over the parsed referee replies (the run's terms leave those rows' reward).

What is ours everywhere: the prompt wording (after the releases'), one policy update on solutions and judgments
together (SPARK's release trains the judge items in a later update of their own), each judgment row under the prompt
it was sampled from, judgment rows scored 0 by the run's reward terms (they are not answers: ``accuracy`` and
``reward/<term>/*`` count them, ``<prefix>/solution_accuracy`` is the solutions'), a reply whose verdict does not
parse scored as the method says and counted, never a crash. Put the stage first among the group stages.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Mapping, Sequence

import torch

from rlexp.algorithms.group_stages.base import append_reward_column
from rlexp.algorithms.group_stages.demonstrations import _align_extras, _groups
from rlexp.algorithms.group_stages.discussion import fit_quotes
from rlexp.algorithms.group_stages.guidance import _require, rollout_questions
from rlexp.core.batch import RolloutBatch
from rlexp.core.masks import UNSCORED
from rlexp.core.registry import GROUP_STAGES
from rlexp.rewards.answers import extract_answer
from rlexp.rewards.judges import compile_pattern, parse_score

PARSED, MISSING, MALFORMED, OUT_OF_RANGE = "parsed", "missing", "malformed", "out_of_range"
CORRECT, WRONG, NO_ANSWER = "correct", "wrong", "no_answer"

# ---- RISE (our wording, after the release's CRITIQUE_PROMPT and QWEN_MATH_SYSTEM_PROMPT) ------------------------
RISE_SYSTEM_PROMPT = "Please reason step by step, and put your final answer within \\boxed{}."
RISE_TEMPLATE = (
    "Below are a question and a tentative response to it. Evaluate the response and rate it by these criteria:\n\n"
    "1. The response states no final answer: rate it \\boxed{{-1}}.\n"
    "2. The response's final answer is correct: rate it \\boxed{{1}}.\n"
    "3. The response's final answer is incorrect: rate it \\boxed{{-0.5}}.\n\n"
    "### Question Begin ###\n{question}\n### Question End ###\n\n"
    "### Response Begin ###\n{solution}\n### Response End ###\n\n"
    "Briefly summarize your analysis, then state your final rating enclosed in \\boxed{{}} at the end."
)
BOXED_PATTERN = r"\\boxed\{\s*([^{}]*?)\s*\}"
RISE_OUTCOME_SCORES = (1.0, -0.5, -1.0)  # the solution's r_o: correct, wrong, no stated answer
RISE_VERIFY_REWARDS = (1.0, -0.5, -1.0)  # the verification's: verdict = r_o, another verdict, no \boxed{}

# ---- SPARK (our wording, after the release's PROMPT_TEMPLATES_SINGLE / _DOUBLE / _SELF_REFLECTION[_ANS]) ---------
SPARK_POINTWISE_TEMPLATE = (
    "You are an expert in answer verification. Given a question and an answer, decide whether the answer is "
    "correct. First reason about it, then give your judgment, 'Yes' or 'No', and repeat it inside \\boxed{{}}.\n\n"
    "<Question>:\n{question}\n\n<Answer>:\n{answer}\n\n<Judgement>:"
)
SPARK_PAIRWISE_TEMPLATE = (
    "You are given a question and two answers, (A) and (B); one of them is correct. Analyse both, decide which one "
    "is correct and give your choice inside \\boxed{{}}: \\boxed{{A}} or \\boxed{{B}}.\n\n"
    "<Question>:\n{question}\n\n(A) {a}\n(B) {b}\n\n<Judgement>:"
)
SPARK_REFLECTION_COT_TEMPLATE = (
    "You are given a question and a reasoning process for it. Judge whether the reasoning and its final answer are "
    "correct. If they are, summarise the logic and repeat the answer; if not, give a correct reasoning and answer."
    "\n\nQuestion:\n{question}\n\nProvided reasoning:\n{cot}"
)
SPARK_REFLECTION_ANSWER_TEMPLATE = (
    "You are given a question and a proposed answer. Judge whether the answer is correct. If it is, briefly confirm "
    "it; if not, give a correct reasoning and the correct answer.\n\nQuestion:\n{question}\n\nAnswer:\n{answer}"
)
BOX_PATTERN = r"\\box(?:ed)?\{\s*([^{}]*?)\s*\}"  # the release's templates ask for \box{}, its verifier reads \boxed{}
POINTWISE_VERDICTS = {"yes": 1.0, "no": 0.0}
PAIRWISE_VERDICTS = {"a": 1.0, "b": 0.0}  # 1: the first answer shown is the correct one

# ---- URPO (our wording) ----------------------------------------------------------------------------------------
URPO_TEMPLATE = (
    "You are the referee. Below are a question and {n} candidate responses to it.\n\n"
    "Question:\n{question}\n\n{responses}\n\n"
    "Score each response from 1 (wrong or useless) to 10 (correct and clear). End your reply with one line "
    "'Scores: s1, s2, ...' giving the {n} scores in the order of the responses."
)
URPO_RESPONSE_TEMPLATE = "Response {index}:\n{response}"
SCORES_PATTERN = r"scores?\s*[:=]\s*\[?\s*(-?\d+(?:\.\d+)?(?:\s*[,;]\s*-?\d+(?:\.\d+)?)*)"
_NUMBER = r"(-?\d+(?:\.\d+)?)"
REFEREE_REWARDS = ("absolute", "pairwise")


# ---- parsing and rewards (pure functions) ----------------------------------------------------------------------
def read_verdict(
    text: str, pattern, scale: Sequence[float] = (0.0, 1.0), verdicts: Mapping[str, float] | None = None
) -> tuple[float | None, str]:
    """(verdict, status) of a judge reply: group 1 of the LAST match of ``pattern`` (``rlexp.rewards.judges.
    parse_score``), as a number in ``scale`` (its raw value, not normalised) or, with ``verdicts``, the value of the
    word. Status ``missing`` (no match: verdict None), ``malformed`` (a match that is no number in ``scale`` / no
    known word: None) or ``parsed``."""
    rx = compile_pattern(pattern, "pattern") if isinstance(pattern, str) else pattern
    if rx.search(text or "") is None:
        return None, MISSING
    lo, hi = float(scale[0]), float(scale[1])
    value = parse_score(text, rx, (lo, hi), verdicts)
    if value is None:
        return None, MALFORMED
    return (float(value) if verdicts is not None else lo + float(value) * (hi - lo)), PARSED


def outcome_class(label: float, stated: bool, correct_min: float) -> str:
    """The rule verifier's outcome of a solution: ``correct`` (label term ≥ ``correct_min``), ``wrong`` (a stated
    final answer that is not correct) or ``no_answer`` (no final answer in the run's answer format)."""
    if label >= correct_min:
        return CORRECT
    return WRONG if stated else NO_ANSWER


def verification_reward(verdict: float | None, status: str, target: float, rewards: Sequence[float]) -> float:
    """RISE's verification reward: ``rewards`` = (match, mismatch, unparsed); a verdict within 1e-6 of ``target``
    matches; a malformed verdict (a boxed value that is no number in range) is a mismatch (the release's verifier
    finds a boxed answer, not equal to the target); no ``\\boxed{}`` at all is unparsed."""
    if status == MISSING:
        return float(rewards[2])
    if verdict is not None and abs(verdict - target) <= 1e-6:
        return float(rewards[0])
    return float(rewards[1])


def parse_scores(text: str, n: int, pattern, scale: Sequence[float]) -> tuple[list[float] | None, str]:
    """The referee's N-way scores: the LAST ``pattern`` match (group 1: the comma-separated numbers), each normalised
    from ``scale`` onto [0, 1] (``parse_score``). (None, status) unless exactly ``n`` numbers all in ``scale``:
    ``missing`` (no match), ``malformed`` (another count), ``out_of_range``."""
    rx = compile_pattern(pattern, "pattern") if isinstance(pattern, str) else pattern
    matches = list(rx.finditer(text or ""))
    if not matches:
        return None, MISSING
    parts = [p.strip() for p in matches[-1].group(1).replace(";", ",").split(",") if p.strip()]
    if len(parts) != n:
        return None, MALFORMED
    scores = [parse_score(p, _NUMBER, scale) for p in parts]
    if any(s is None for s in scores):
        return None, OUT_OF_RANGE
    return [float(s) for s in scores], PARSED


def referee_reward(scores: Sequence[float], labels: Sequence[float], mode: str = "absolute") -> float:
    """The referee's agreement with the rule's labels (in [0, 1]) given its normalised ``scores``: ``absolute``
    1 − mean |s_i − y_i|; ``pairwise`` the share of pairs with y_i > y_j that it orders s_i > s_j (a tie ½), the
    absolute agreement when the labels do not differ."""
    y = [min(max(float(v), 0.0), 1.0) for v in labels]
    if mode == "pairwise":
        pairs = [(i, j) for i in range(len(y)) for j in range(len(y)) if y[i] > y[j]]
        if pairs:
            won = [1.0 if scores[i] > scores[j] else 0.5 if scores[i] == scores[j] else 0.0 for i, j in pairs]
            return sum(won) / len(won)
    return 1.0 - sum(abs(s - t) for s, t in zip(scores, y)) / len(y)


def spread(total: int, sizes: Sequence[int], rng: random.Random) -> list[list[int]]:
    """Rows to verify per group (verl's ``downsampling``, as RISE draws its critiques): ``total`` spread evenly over
    the groups, the remainder one more in randomly drawn groups (verl: its first groups; its batch is shuffled), each
    group's rows drawn at random, in order; never more than a group has."""
    base, extra = divmod(int(total), len(sizes))
    bonus = set(rng.sample(range(len(sizes)), extra))
    return [sorted(rng.sample(range(n), min(n, base + (k in bonus)))) for k, n in enumerate(sizes)]


def share_count(share: float, groups: int) -> int:
    """round(share × groups), halves up."""
    return int(math.floor(share * groups + 0.5))


def _check_template(template: str, fields: Sequence[str], key: str) -> None:
    missing = [f for f in fields if "{" + f + "}" not in template]
    if missing:
        raise ValueError(f"{key} lacks {', '.join('{' + f + '}' for f in missing)}")
    try:
        template.format(**{f: "x" for f in fields})
    except (KeyError, IndexError, ValueError) as e:
        raise ValueError(f"{key}: the template has a field other than {list(fields)} ({e!r})") from e


def _check_share(value, key: str, upper: float | None = 1.0, positive: bool = False) -> float:
    v = float(value)
    if not math.isfinite(v) or v < 0 or (positive and v == 0) or (upper is not None and v > upper):
        low = "(0" if positive else "[0"
        bound = f"in {low}, {upper}]" if upper is not None else ("> 0" if positive else ">= 0")
        raise ValueError(f"{key}={value!r} must be {bound}")
    return v


def _check_samples(samples, key: str) -> int | None:
    if samples is not None and (not isinstance(samples, int) or samples < 1):
        raise ValueError(f"{key}={samples!r} must be null (the group size) or an integer >= 1")
    return samples


def _chat(tokenizer, message: str, system: str | None = None) -> str:
    """A judge prompt: ``message`` as the user turn of the chat template (after ``system``), with the assistant's
    opening."""
    turns = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": message}]
    return tokenizer.apply_chat_template(turns, add_generation_prompt=True, tokenize=False)


class _SelfJudging:
    """What the three stages share: the checks, the judge prompts (fitted to the run's prompt limit), their sampling
    by the policy (one new group per prompt) and the assembled batch."""

    needs_reference = False
    prefix = "self_judge"
    who = "SelfJudging"

    def __init__(self, label_term: str, correct_min: float, name: str, weight: float, seed: int):
        where = f"algorithm.group_stages: {self.who}"
        if not label_term:
            raise ValueError(f"{where}.label_term is empty: the rule verifier's reward term (e.g. accuracy)")
        if not name:
            raise ValueError(f"{where}.name is empty: the judgment reward's column needs a name")
        self.where = where
        self.label_term, self.correct_min = str(label_term), float(correct_min)
        self.name, self.weight, self.seed = str(name), float(weight), int(seed)

    # ---- checks ---------------------------------------------------------------------------------
    def _check(self, batch: RolloutBatch, ctx) -> None:
        _require(ctx, ("policy", "tokenizer", "rollout", "reward_terms"), self.who, "sample its judgments")
        if getattr(ctx.rollout, "needs_records", False):
            raise ValueError(
                f"algorithm.group_stages: {self.who} samples single replies (judgments): run it with a single-turn "
                f"rollout (rollout=hf), not {type(ctx.rollout).__name__}"
            )
        if batch.rewards is None or list(batch.reward_names) != list(ctx.reward_terms):
            raise ValueError(
                f"algorithm.group_stages: {self.who} adds rows scored by the run's reward terms and needs the batch's "
                f"reward columns to be the terms' ({batch.reward_names} vs {list(ctx.reward_terms)}): put it first "
                "among the group stages"
            )
        if self.label_term not in batch.reward_names:
            raise KeyError(
                f"algorithm.group_stages: {self.who}.label_term={self.label_term!r} is not a reward term (terms: "
                f"{batch.reward_names}): the judgments are rewarded against the rule verifier's outcome"
            )

    def _begin(self, batch: RolloutBatch, ctx) -> tuple[random.Random, list[list[int]], list[float]]:
        """Check the batch, reset the step's counters; the step's random stream, the groups' rows and the rule's
        label per row."""
        self._check(batch, ctx)
        self._start(batch, ctx)
        return self._rng(ctx), _groups(batch), batch.term(self.label_term).detach().float().cpu().tolist()

    def _start(self, batch: RolloutBatch, ctx) -> None:
        self._next_gid = int(batch.group_ids.max()) + 1
        self._clipped = 0
        self._limit = getattr(getattr(getattr(ctx, "prompt_format", None), "limit", None), "limit", None)
        self._timing = {"generate": 0.0, "reward": 0.0}

    def _rng(self, ctx) -> random.Random:
        return random.Random(f"{self.seed}:{int(getattr(ctx, 'step', 1) or 1)}")

    # ---- prompts --------------------------------------------------------------------------------
    def _judge_prompt(self, ctx, template: str, fixed: dict, quoted: dict, system: str | None = None) -> str:
        """The chat-templated judge prompt: ``template`` filled with ``fixed`` and ``quoted`` texts, the quoted ones
        cut from their start where the prompt would pass the run's prompt limit."""
        tok, keys = ctx.tokenizer, list(quoted)

        def compose(quotes):
            return template.format(**fixed, **{k: q.strip() for k, q in zip(keys, quotes)})

        text, cut = fit_quotes(tok, compose, lambda m: _chat(tok, m, system), [quoted[k] for k in keys], self._limit)
        self._clipped += int(cut)
        return _chat(tok, text, system)

    def _question_prompt(self, ctx, template: str, fixed: dict, quoted: dict) -> str:
        """A question in the run's prompt format (scored by the run's terms): the template's text, quotes fitted."""
        tok, fmt, keys = ctx.tokenizer, ctx.prompt_format, list(quoted)

        def compose(quotes):
            return template.format(**fixed, **{k: q.strip() for k, q in zip(keys, quotes)})

        text, cut = fit_quotes(tok, compose, lambda q: fmt.render_full(tok, q), [quoted[k] for k in keys], self._limit)
        self._clipped += int(cut)
        return text

    # ---- sampling -------------------------------------------------------------------------------
    def _new_gid(self) -> int:
        self._next_gid += 1
        return self._next_gid - 1

    def _sample(self, ctx, prompts: list[str], records: list[dict], sizes: list[int], role: str) -> RolloutBatch | None:
        """``sizes[j]`` replies to rendered prompt j by the policy at the rollout's settings, prompt j's replies one
        new group, in prompt order; the run's reward columns 0 (the replies are judgments, not answers)."""
        if not prompts:
            return None
        dtype = getattr(ctx, "autocast_dtype", None)
        device = next(ctx.policy.parameters()).device
        by_size: dict[int, list[int]] = {}
        for j, n in enumerate(sizes):
            by_size.setdefault(n, []).append(j)
        pieces: dict[int, RolloutBatch] = {}
        for n, js in by_size.items():
            t0 = time.perf_counter()
            with torch.autocast(device.type, dtype=dtype or torch.bfloat16, enabled=dtype is not None):
                out = ctx.rollout.generate(ctx.policy, ctx.tokenizer, [prompts[j] for j in js], num_generations=n)
            self._timing["generate"] += time.perf_counter() - t0
            gids = torch.tensor([self._new_gid() for _ in js], dtype=torch.long, device=out.completion_ids.device)
            rows = RolloutBatch.from_generation(
                out,
                gids.repeat_interleave(n),
                [prompts[j] for j in js for _ in range(n)],
                [{**records[j], "self_judge_role": role} for j in js for _ in range(n)],
            )
            for k, j in enumerate(js):
                pieces[j] = rows.select(list(range(k * n, (k + 1) * n)))
        ordered = [pieces[j] for j in range(len(prompts))]
        out = ordered[0] if len(ordered) == 1 else RolloutBatch.concat(ordered)
        return self._zero_scores(out, ctx)

    def _zero_scores(self, rows: RolloutBatch, ctx) -> RolloutBatch:
        n, names = len(rows), list(ctx.reward_terms)
        rows.rewards = torch.zeros(n, len(names))
        rows.reward_failures = torch.zeros(n, len(names), dtype=torch.bool)
        rows.reward_names = names
        rows.reward = torch.zeros(n)
        return rows

    def _questions(self, ctx, questions: list[str], records: list[dict], size: int) -> RolloutBatch:
        """``size`` answers to each question in the run's prompt format, scored by the run's terms (SPARK's
        reflections), one new group per question."""
        gids = [self._new_gid() for _ in questions]
        rolled = rollout_questions(
            ctx, gids, questions, [{**r, "self_judge_role": "reflection"} for r in records], size, self._timing
        )
        return rolled

    # ---- the batch ------------------------------------------------------------------------------
    def _assemble(self, batch: RolloutBatch, parts: list[RolloutBatch]) -> RolloutBatch:
        """The solutions followed by ``parts``, with the same reward columns and per-row extras."""
        parts = [p for p in parts if p is not None and len(p)]
        if not parts:
            return batch
        for rows in parts:
            rows.rewards = rows.rewards.to(device=batch.rewards.device, dtype=batch.rewards.dtype)
            rows.reward = rows.reward.to(device=batch.reward.device, dtype=batch.reward.dtype)
            rows.reward_weights = batch.reward_weights
            rows.reward_failures = rows.reward_failures.to(batch.rewards.device)
            rows.group_ids = rows.group_ids.to(batch.group_ids.device)
            rows.truncated = rows.truncated.to(batch.truncated.device)
        pieces = [batch, *parts]
        for a in pieces:  # the same per-row extras on every piece (a key one lacks: 0, loss weights 1)
            for b in pieces:
                if a is not b:
                    _align_extras(a, b)
        return RolloutBatch.concat(pieces)

    def _finish(self, batch: RolloutBatch, out: RolloutBatch, stats: dict) -> RolloutBatch:
        stats[f"{self.prefix}/clipped_prompts"] = float(self._clipped)
        stats[f"time/{self.prefix}_generate_s"] = self._timing["generate"]
        out.stats = {**batch.stats, **stats}
        out.stats["time/reward_s"] = batch.stats.get("time/reward_s", 0.0) + self._timing["reward"]
        return out

    @staticmethod
    def _statuses(prefix: str, statuses: list[str]) -> dict[str, float]:
        return {
            f"{prefix}_parsed": float(statuses.count(PARSED)),
            f"{prefix}_parse_failures": float(len(statuses) - statuses.count(PARSED)),
            f"{prefix}_missing": float(statuses.count(MISSING)),
            f"{prefix}_malformed": float(statuses.count(MALFORMED) + statuses.count(OUT_OF_RANGE)),
        }


def _mean(xs: Sequence[float]) -> float:
    return float(sum(xs) / len(xs)) if xs else 0.0


# ======================================================================================================================
@GROUP_STAGES.register
class SelfVerification(_SelfJudging):
    """RISE: the policy verifies a share of its own solutions each step; verification rows rewarded by whether their
    verdict matches the rule verifier's outcome score, trained with the solutions (module doc).

    ``label_term``: the rule verifier's reward term (a row is correct when it is ≥ ``correct_min``; one without a
    final answer in the run's answer format has none). ``verify_share``: verified solutions per step / groups (the
    release's critique_batch_size / train_batch_size = 128 / 1024; at least one). ``samples``: replies per
    verification prompt (null: the group size; the release: the rollout's n). ``outcome_scores``: r_o of a (correct,
    wrong, unanswered) solution; ``verify_rewards``: (match, mismatch, unparsed). ``template`` ({question},
    {solution}), ``system_prompt``, ``pattern`` (the verdict, group 1, last match; a number in ``scale``). ``name``,
    ``weight``: the verification reward's column. ``seed``: the draw of the verified solutions (with the step).

    Stats: ``rise/verify_prompts``, ``rise/verify_rows``, ``rise/verify_accuracy`` (replies whose verdict equals the
    target), ``rise/verify_reward_mean``, ``rise/verify_parse_failures`` (= ``rise/verify_missing`` +
    ``rise/verify_malformed``; ``rise/verify_parsed``), ``rise/verified_correct_frac`` (verified solutions the rule
    finds correct), ``rise/solution_accuracy`` (the label term on the solutions), ``rise/clipped_prompts``,
    ``time/rise_generate_s``."""

    prefix = "rise"
    who = "SelfVerification"

    def __init__(
        self,
        label_term: str = "accuracy",
        correct_min: float = 0.5,
        verify_share: float = 0.125,
        samples: int | None = None,
        outcome_scores: Sequence[float] = RISE_OUTCOME_SCORES,
        verify_rewards: Sequence[float] = RISE_VERIFY_REWARDS,
        template: str = RISE_TEMPLATE,
        system_prompt: str | None = RISE_SYSTEM_PROMPT,
        pattern: str = BOXED_PATTERN,
        scale: Sequence[float] = (-1.0, 1.0),
        name: str = "verification",
        weight: float = 1.0,
        seed: int = 0,
    ):
        super().__init__(label_term, correct_min, name, weight, seed)
        w = self.where
        self.verify_share = _check_share(verify_share, f"{w}.verify_share", upper=None, positive=True)
        self.samples = _check_samples(samples, f"{w}.samples")
        scores, rewards = [float(x) for x in outcome_scores], [float(x) for x in verify_rewards]
        if len(scores) != 3:
            raise ValueError(f"{w}.outcome_scores={scores}: three scores (correct, wrong, no answer)")
        if len(rewards) != 3:
            raise ValueError(f"{w}.verify_rewards={rewards}: three rewards (match, mismatch, unparsed)")
        self.scale = tuple(float(x) for x in scale)
        if len(self.scale) != 2 or not self.scale[0] < self.scale[1]:
            raise ValueError(f"{w}.scale={list(scale)}: [lowest, highest] with lowest < highest")
        if any(not self.scale[0] <= s <= self.scale[1] for s in scores):
            raise ValueError(f"{w}.outcome_scores={scores} must lie in scale {list(self.scale)}")
        _check_template(template, ("question", "solution"), f"{w}.template")
        self.pattern = compile_pattern(pattern, f"{w}.pattern")
        self.targets = dict(zip((CORRECT, WRONG, NO_ANSWER), scores))
        self.rewards, self.template, self.system_prompt = tuple(rewards), template, system_prompt

    def verdict(self, reply: str) -> tuple[float | None, str]:
        """(verdict, status) of a verification reply."""
        return read_verdict(reply, self.pattern, self.scale)

    def __call__(self, batch: RolloutBatch, ctx) -> RolloutBatch:
        if len(batch) == 0:
            return batch
        rng, groups, label = self._begin(batch, ctx)
        fmt = getattr(ctx, "answer_format", None) or "auto"
        total = min(len(batch), max(1, share_count(self.verify_share, len(groups))))
        chosen = [rows[k] for rows, ks in zip(groups, spread(total, [len(r) for r in groups], rng)) for k in ks]
        size_of = {i: len(rows) for rows in groups for i in rows}
        prompts, records, sizes, targets, outcomes = [], [], [], [], []
        for i in chosen:
            record = batch.records[i]
            question = str(record.get("question", batch.prompts[i]))
            solution = batch.completions[i]
            outcome = outcome_class(label[i], extract_answer(solution, fmt) is not None, self.correct_min)
            prompts.append(
                self._judge_prompt(
                    ctx, self.template, {"question": question.strip()}, {"solution": solution}, self.system_prompt
                )
            )
            records.append(record)
            sizes.append(self.samples or size_of[i])
            targets.append(self.targets[outcome])
            outcomes.append(outcome)
        rows = self._sample(ctx, prompts, records, sizes, "verification")
        owner = [j for j, n in enumerate(sizes) for _ in range(n)]
        parsed = [self.verdict(t) for t in rows.completions]
        rewards = [verification_reward(v, st, targets[j], self.rewards) for (v, st), j in zip(parsed, owner)]
        hits = [v is not None and abs(v - targets[j]) <= 1e-6 for (v, _), j in zip(parsed, owner)]
        out = self._assemble(batch, [rows])
        column = torch.tensor([0.0] * len(batch) + rewards, dtype=torch.float32)
        out = append_reward_column(out, self.name, column, self.weight)
        stats = {
            "rise/verify_prompts": float(len(prompts)),
            "rise/verify_rows": float(len(rows)),
            "rise/verify_accuracy": _mean([float(h) for h in hits]),
            "rise/verify_reward_mean": _mean(rewards),
            "rise/verified_correct_frac": _mean([float(o == CORRECT) for o in outcomes]),
            "rise/solution_accuracy": _mean(label),
            **self._statuses("rise/verify", [st for _, st in parsed]),
        }
        return self._finish(batch, out, stats)


# ======================================================================================================================
@GROUP_STAGES.register
class RecycledJudging(_SelfJudging):
    """SPARK: the step's rule-verified rollouts recycled into pointwise, pairwise and reflection items the policy
    answers in the same step; judge rows rewarded by whether their verdict equals the rule's label, reflection rows
    by the run's terms (module doc).

    ``label_term`` / ``correct_min``: the rule verifier and its "correct". ``judge_on``: what a judge item shows of a
    rollout — ``answer`` (its stated final answer in the run's format, as the release's boxed answer; a rollout
    without one is not shown, the item skipped) or ``solution`` (the whole completion). ``pointwise_prob``: a mixed
    group's chance of a pointwise item instead of a pairwise one (0.3). ``judge_share`` / ``reflection_share``: at
    most that share of the step's groups gives a judge / reflection item (the release: 32 of 64 each), drawn at
    random. ``reflection_cot_share``: the first share of the groups (in batch order) reflects on a wrong reasoning,
    the rest on a wrong stated answer (the release: halves). ``samples``: replies per item (null: the group size).
    ``pointwise_template`` ({question}, {answer}), ``pairwise_template`` ({question}, {a}, {b}),
    ``reflection_cot_template`` ({question}, {cot}), ``reflection_answer_template`` ({question}, {answer}),
    ``pattern``: the boxed verdict. ``correct_reward`` / ``wrong_reward``: a judge reply whose verdict equals / does
    not equal (or does not give) the label. ``name``, ``weight``: the judge reward's column.

    Stats: ``spark/judge_items`` (``spark/pointwise_items``, ``spark/pairwise_items``), ``spark/reflection_items``,
    ``spark/skipped_items`` (items whose rollout stated no answer), ``spark/judge_rows``, ``spark/reflection_rows``,
    ``spark/judge_accuracy`` (judge replies whose verdict equals the label), ``spark/judge_reward_mean``,
    ``spark/judge_parse_failures`` (``_missing``, ``_malformed``, ``_parsed``), ``spark/reflection_accuracy`` (the
    label term on the reflections), ``spark/solution_accuracy``, ``spark/clipped_prompts``, ``time/spark_generate_s``.
    """

    prefix = "spark"
    who = "RecycledJudging"

    def __init__(
        self,
        label_term: str = "accuracy",
        correct_min: float = 0.5,
        judge_on: str = "answer",
        pointwise_prob: float = 0.3,
        judge_share: float = 0.5,
        reflection_share: float = 0.5,
        reflection_cot_share: float = 0.5,
        samples: int | None = None,
        pointwise_template: str = SPARK_POINTWISE_TEMPLATE,
        pairwise_template: str = SPARK_PAIRWISE_TEMPLATE,
        reflection_cot_template: str = SPARK_REFLECTION_COT_TEMPLATE,
        reflection_answer_template: str = SPARK_REFLECTION_ANSWER_TEMPLATE,
        pattern: str = BOX_PATTERN,
        correct_reward: float = 1.0,
        wrong_reward: float = 0.0,
        name: str = "judge",
        weight: float = 1.0,
        seed: int = 0,
    ):
        super().__init__(label_term, correct_min, name, weight, seed)
        w = self.where
        if judge_on not in ("answer", "solution"):
            raise ValueError(f"{w}.judge_on={judge_on!r}: 'answer' (the stated final answer) or 'solution'")
        self.judge_on = judge_on
        self.pointwise_prob = _check_share(pointwise_prob, f"{w}.pointwise_prob")
        self.judge_share = _check_share(judge_share, f"{w}.judge_share")
        self.reflection_share = _check_share(reflection_share, f"{w}.reflection_share")
        self.reflection_cot_share = _check_share(reflection_cot_share, f"{w}.reflection_cot_share")
        if self.judge_share == 0 and self.reflection_share == 0:
            raise ValueError(f"{w}: judge_share and reflection_share are both 0: the stage would add nothing")
        self.samples = _check_samples(samples, f"{w}.samples")
        _check_template(pointwise_template, ("question", "answer"), f"{w}.pointwise_template")
        _check_template(pairwise_template, ("question", "a", "b"), f"{w}.pairwise_template")
        _check_template(reflection_cot_template, ("question", "cot"), f"{w}.reflection_cot_template")
        _check_template(reflection_answer_template, ("question", "answer"), f"{w}.reflection_answer_template")
        self.pattern = compile_pattern(pattern, f"{w}.pattern")
        self.pointwise_template, self.pairwise_template = pointwise_template, pairwise_template
        self.reflection_cot_template, self.reflection_answer_template = (
            reflection_cot_template,
            reflection_answer_template,
        )
        self.correct_reward, self.wrong_reward = float(correct_reward), float(wrong_reward)

    def verdict(self, reply: str, kind: str) -> tuple[float | None, str]:
        """(verdict, status) of a judge reply: 1/0 for Yes/No (pointwise) or A/B (pairwise: 1 = the first shown)."""
        table = POINTWISE_VERDICTS if kind == "pointwise" else PAIRWISE_VERDICTS
        return read_verdict(reply, self.pattern, verdicts=table)

    def _items(self, batch, groups, correct, shown, rng):
        """The judge items, one per group at most: (group index, kind, texts shown, label)."""
        items, skipped = [], 0
        for g, rows in enumerate(groups):
            pos = [i for i in rows if correct[i]]
            neg = [i for i in rows if not correct[i]]
            if not pos or not neg:  # a uniform group: pointwise on its first answer (all wrong: a random one)
                cands = [i for i in rows if shown[i] is not None]
                if not cands:
                    skipped += 1
                    continue
                i = cands[0] if pos else rng.choice(cands)
                items.append((g, "pointwise", (shown[i],), float(correct[i])))
            elif rng.random() < self.pointwise_prob:  # pointwise on a random correct or wrong answer
                side = pos if rng.random() < 0.5 else neg
                i = rng.choice(side)
                if shown[i] is None:
                    skipped += 1
                    continue
                items.append((g, "pointwise", (shown[i],), float(correct[i])))
            else:  # pairwise: a correct and a wrong answer, in random order
                i, j = rng.choice(pos), rng.choice(neg)
                if shown[i] is None or shown[j] is None:
                    skipped += 1
                    continue
                first = rng.random() < 0.5
                items.append((g, "pairwise", (shown[i], shown[j]) if first else (shown[j], shown[i]), float(first)))
        return items, skipped

    def _reflections(self, batch, groups, correct, stated, rng):
        """The reflection items: (group index, mode, the wrong reasoning or stated answer)."""
        items, cot_groups = [], self.reflection_cot_share * len(groups)
        for g, rows in enumerate(groups):
            neg = [i for i in rows if not correct[i]]
            if not neg:
                continue
            if g < cot_groups:
                items.append((g, "cot", batch.completions[rng.choice(neg)]))
            else:
                answered = [i for i in neg if stated[i] is not None]
                if answered:
                    items.append((g, "answer", stated[rng.choice(answered)]))
        return items

    @staticmethod
    def _cap(items: list, share: float, groups: int, rng: random.Random) -> list:
        cap = share_count(share, groups)
        if len(items) <= cap:
            return items
        keep = sorted(rng.sample(range(len(items)), cap))
        return [items[k] for k in keep]

    def __call__(self, batch: RolloutBatch, ctx) -> RolloutBatch:
        if len(batch) == 0:
            return batch
        rng, groups, label = self._begin(batch, ctx)
        correct = [v >= self.correct_min for v in label]
        fmt = getattr(ctx, "answer_format", None) or "auto"
        stated = [extract_answer(c, fmt) for c in batch.completions]
        shown = stated if self.judge_on == "answer" else list(batch.completions)
        judge_items, skipped = self._items(batch, groups, correct, shown, rng)
        reflections = self._reflections(batch, groups, correct, stated, rng)
        judge_items = self._cap(judge_items, self.judge_share, len(groups), rng)
        reflections = self._cap(reflections, self.reflection_share, len(groups), rng)
        question_of = [str(batch.records[rows[0]].get("question", batch.prompts[rows[0]])) for rows in groups]
        record_of = [batch.records[rows[0]] for rows in groups]
        size_of = [self.samples or len(rows) for rows in groups]
        parts: list[RolloutBatch] = []
        column: list[float] = [0.0] * len(batch)
        statuses: list[str] = []
        hits: list[float] = []
        judge_rewards: list[float] = []
        if judge_items:
            prompts = []
            for g, kind, texts, _ in judge_items:
                if kind == "pointwise":
                    prompts.append(
                        self._judge_prompt(
                            ctx, self.pointwise_template, {"question": question_of[g].strip()}, {"answer": texts[0]}
                        )
                    )
                else:
                    prompts.append(
                        self._judge_prompt(
                            ctx,
                            self.pairwise_template,
                            {"question": question_of[g].strip()},
                            {"a": texts[0], "b": texts[1]},
                        )
                    )
            sizes = [size_of[g] for g, *_ in judge_items]
            rows = self._sample(ctx, prompts, [record_of[g] for g, *_ in judge_items], sizes, "judge")
            owner = [k for k, n in enumerate(sizes) for _ in range(n)]
            for text, k in zip(rows.completions, owner):
                _, kind, _, target = judge_items[k]
                v, st = self.verdict(text, kind)
                hit = v is not None and v == target
                statuses.append(st)
                hits.append(float(hit))
                judge_rewards.append(self.correct_reward if hit else self.wrong_reward)
            parts.append(rows)
            column += judge_rewards
        reflection_acc: list[float] = []
        n_reflection_rows = 0
        if reflections:
            questions = []
            for g, mode, text in reflections:
                template = self.reflection_cot_template if mode == "cot" else self.reflection_answer_template
                questions.append(
                    self._question_prompt(
                        ctx,
                        template,
                        {"question": question_of[g].strip()},
                        {"cot" if mode == "cot" else "answer": text},
                    )
                )
            by_size: dict[int, list[int]] = {}
            for k, (g, _, _) in enumerate(reflections):
                by_size.setdefault(size_of[g], []).append(k)
            for n, ks in by_size.items():
                rows = self._questions(ctx, [questions[k] for k in ks], [record_of[reflections[k][0]] for k in ks], n)
                reflection_acc += rows.term(self.label_term).detach().float().cpu().tolist()
                n_reflection_rows += len(rows)
                parts.append(rows)
                column += [0.0] * len(rows)
        out = self._assemble(batch, parts)
        out = append_reward_column(out, self.name, torch.tensor(column, dtype=torch.float32), self.weight)
        stats = {
            "spark/judge_items": float(len(judge_items)),
            "spark/pointwise_items": float(sum(kind == "pointwise" for _, kind, _, _ in judge_items)),
            "spark/pairwise_items": float(sum(kind == "pairwise" for _, kind, _, _ in judge_items)),
            "spark/reflection_items": float(len(reflections)),
            "spark/skipped_items": float(skipped),
            "spark/judge_rows": float(len(judge_rewards)),
            "spark/reflection_rows": float(n_reflection_rows),
            "spark/judge_accuracy": _mean(hits),
            "spark/judge_reward_mean": _mean(judge_rewards),
            "spark/reflection_accuracy": _mean(reflection_acc),
            "spark/solution_accuracy": _mean(label),
            **self._statuses("spark/judge", statuses),
        }
        return self._finish(batch, out, stats)


# ======================================================================================================================
@GROUP_STAGES.register
class SelfReferee(_SelfJudging):
    """URPO: the policy referees each of its groups (one prompt showing the G responses, N-way scores); referee rows
    of groups with a ground truth train, rewarded by their agreement with the rule's labels; the players of open
    groups are rewarded by the referee's scores instead of the run's terms (module doc).

    ``label_term`` / ``correct_min``: the rule verifier (labels clipped to [0, 1]; "correct" for the agreement
    statistics). ``samples``: referee replies per group (null: the group size). ``open_share``: the share of the
    step's groups with a ground truth whose label is hidden (drawn at random; they stand in for open-ended
    instructions); a record without ``answer`` is always open. ``reward``: the referee's reward, ``absolute``
    (1 − mean |s_i − y_i|) or ``pairwise`` (correctly ordered (correct, wrong) pairs). ``failure_reward``: a referee
    reply whose scores do not parse. ``unrewarded_score``: the players' self reward when none of their group's
    referee replies parsed. ``template`` ({question}, {responses}, {n}), ``response_template`` ({index},
    {response}), ``pattern`` (the scores, group 1), ``scale`` (1–10). ``name``, ``weight``: the referee's reward
    column; ``self_name``, ``self_weight``: the players' self-reward column (open groups).

    Stats: ``urpo/referee_prompts``, ``urpo/referee_rows`` (that train), ``urpo/referee_reward_mean``,
    ``urpo/referee_agreement`` (per response, parsed replies of labelled groups: score ≥ ½ ⇔ correct),
    ``urpo/referee_parse_failures`` (``_missing``, ``_malformed`` (wrong count or out of range), ``_parsed``),
    ``urpo/open_groups``, ``urpo/self_rewarded_groups``, ``urpo/unrewarded_groups``, ``urpo/self_reward_mean``,
    ``urpo/self_reward_rule_agreement`` (open rows with a hidden label: self reward ≥ ½ ⇔ correct),
    ``urpo/solution_accuracy``, ``urpo/clipped_prompts``, ``time/urpo_generate_s``."""

    prefix = "urpo"
    who = "SelfReferee"

    def __init__(
        self,
        label_term: str = "accuracy",
        correct_min: float = 0.5,
        samples: int | None = None,
        open_share: float = 0.25,
        reward: str = "absolute",
        failure_reward: float = 0.0,
        unrewarded_score: float = 0.0,
        template: str = URPO_TEMPLATE,
        response_template: str = URPO_RESPONSE_TEMPLATE,
        pattern: str = SCORES_PATTERN,
        scale: Sequence[float] = (1, 10),
        name: str = "referee",
        weight: float = 1.0,
        self_name: str = "self_reward",
        self_weight: float = 1.0,
        seed: int = 0,
    ):
        super().__init__(label_term, correct_min, name, weight, seed)
        w = self.where
        self.samples = _check_samples(samples, f"{w}.samples")
        self.open_share = _check_share(open_share, f"{w}.open_share")
        if reward not in REFEREE_REWARDS:
            raise ValueError(f"{w}.reward={reward!r}: one of {list(REFEREE_REWARDS)}")
        self.scale = tuple(float(x) for x in scale)
        if len(self.scale) != 2 or not self.scale[0] < self.scale[1]:
            raise ValueError(f"{w}.scale={list(scale)}: [lowest, highest] with lowest < highest")
        if not self_name or self_name == name:
            raise ValueError(f"{w}.self_name={self_name!r} must be a column name other than name={name!r}")
        _check_template(template, ("question", "responses", "n"), f"{w}.template")
        _check_template(response_template, ("index", "response"), f"{w}.response_template")
        self.pattern = compile_pattern(pattern, f"{w}.pattern")
        self.reward_mode, self.failure_reward = reward, float(failure_reward)
        self.unrewarded_score = float(unrewarded_score)
        self.template, self.response_template = template, response_template
        self.self_name, self.self_weight = str(self_name), float(self_weight)

    def scores(self, reply: str, n: int) -> tuple[list[float] | None, str]:
        """(normalised scores, status) of a referee reply on ``n`` responses."""
        return parse_scores(reply, n, self.pattern, self.scale)

    def _referee_prompt(self, ctx, question: str, responses: list[str]) -> str:
        tok, n = ctx.tokenizer, len(responses)

        def compose(quotes):
            shown = "\n\n".join(
                self.response_template.format(index=k + 1, response=q.strip()) for k, q in enumerate(quotes)
            )
            return self.template.format(question=question.strip(), responses=shown, n=n)

        text, cut = fit_quotes(tok, compose, lambda m: _chat(tok, m), list(responses), self._limit)
        self._clipped += int(cut)
        return _chat(tok, text)

    def __call__(self, batch: RolloutBatch, ctx) -> RolloutBatch:
        if len(batch) == 0:
            return batch
        rng, groups, label = self._begin(batch, ctx)
        answered = [g for g, rows in enumerate(groups) if _has_answer(batch.records[rows[0]])]
        hidden = set(rng.sample(answered, min(len(answered), share_count(self.open_share, len(answered)))))
        is_open = [g in hidden or g not in set(answered) for g in range(len(groups))]  # answered: a few groups
        prompts, sizes = [], []
        for rows in groups:
            question = str(batch.records[rows[0]].get("question", batch.prompts[rows[0]]))
            prompts.append(self._referee_prompt(ctx, question, [batch.completions[i] for i in rows]))
            sizes.append(self.samples or len(rows))
        referee = self._sample(ctx, prompts, [batch.records[rows[0]] for rows in groups], sizes, "referee")
        owner = [g for g, n in enumerate(sizes) for _ in range(n)]
        statuses, keep, rewards, agree = [], [], [], []
        self_scores: list[list[list[float]]] = [[] for _ in groups]  # per group: the parsed replies' scores
        for r, (text, g) in enumerate(zip(referee.completions, owner)):
            rows = groups[g]
            s, st = self.scores(text, len(rows))
            statuses.append(st)
            if is_open[g]:
                if s is not None:
                    self_scores[g].append(s)
                continue
            keep.append(r)
            y = [label[i] for i in rows]
            rewards.append(self.failure_reward if s is None else referee_reward(s, y, self.reward_mode))
            if s is not None:
                agree += [float((si >= 0.5) == (yi >= self.correct_min)) for si, yi in zip(s, y)]
        trained = referee.select(keep) if keep else None
        out = self._assemble(batch, [trained])
        n = len(batch)
        self_column = torch.zeros(len(out))
        self_values, self_agree, rewarded, unrewarded = [], [], 0, 0
        for g, rows in enumerate(groups):
            if not is_open[g]:
                continue
            replies = self_scores[g]
            rewarded, unrewarded = rewarded + bool(replies), unrewarded + (not replies)
            for k, i in enumerate(rows):
                v = _mean([s[k] for s in replies]) if replies else self.unrewarded_score
                self_column[i] = v
                self_values.append(v)
                if g in hidden:
                    self_agree.append(float((v >= 0.5) == (label[i] >= self.correct_min)))
        open_rows = torch.tensor([i for g, rows in enumerate(groups) if is_open[g] for i in rows], dtype=torch.long)
        if len(open_rows):  # the referee's reward replaces the run's terms on open rows (their columns stay, logged)
            out.reward[open_rows.to(out.reward.device)] = 0.0
            if UNSCORED in out.extras:  # scored now, by the referee
                out.extras[UNSCORED][open_rows.to(out.extras[UNSCORED].device)] = False
        column = torch.tensor([0.0] * n + rewards, dtype=torch.float32)
        out = append_reward_column(out, self.name, column, self.weight)
        out = append_reward_column(out, self.self_name, self_column, self.self_weight)
        stats = {
            "urpo/referee_prompts": float(len(prompts)),
            "urpo/referee_rows": float(len(keep)),
            "urpo/referee_reward_mean": _mean(rewards),
            "urpo/referee_agreement": _mean(agree),
            "urpo/open_groups": float(sum(is_open)),
            "urpo/self_rewarded_groups": float(rewarded),
            "urpo/unrewarded_groups": float(unrewarded),
            "urpo/self_reward_mean": _mean(self_values),
            "urpo/self_reward_rule_agreement": _mean(self_agree),
            "urpo/solution_accuracy": _mean(label),
            **self._statuses("urpo/referee", statuses),
        }
        return self._finish(batch, out, stats)


def _has_answer(record: dict) -> bool:
    """A record with a ground truth to check against (an open-ended instruction has none)."""
    answer = record.get("answer")
    return answer is not None and str(answer).strip() != ""
