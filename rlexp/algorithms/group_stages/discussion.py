"""CoMAS's discussion — "CoMAS: Co-Evolving Multi-Agent Systems via Interaction Rewards" (Xue et al., 2025;
arXiv 2510.08529; released code xxyQwQ/CoMAS, read in its mirror wt-2048/comas: ``marti/worlds/workflows/comas.py``,
``marti/verifiers/comas_reward.py``, ``scripts/train_comas.sh``).

In CoMAS, l agents discuss each problem for a few rounds; every round has three steps:

* solution: each agent writes a solution (from the second round on, its prompt shows ``references`` discussions of
  the previous round, each a solution and its evaluation, drawn at random; the first round's shows none);
* evaluation: for each solution, an agent critiques it (lists its errors);
* scoring: for each (solution, evaluation), an agent weighs the critique and scores the solution 1–3 between
  ``<score>`` tags (LLM-as-a-judge).

Each step's reply is a training experience of the agent that wrote it, rewarded from the score alone (no verifier;
``rlexp.rewards.interaction``): the solution (s − 1)/2, the evaluation 1 − (s − 1)/2 (zero-sum), the scoring 0, or
−1 when its score does not parse (then the other two get 0). Every agent's policy is trained with REINFORCE++ on
its experiences.

How it runs here, with one policy. The paper's agents are several models (the release: four copies of one model,
each trained apart); our trainer trains one policy, so the policy plays every agent and every role, told which by
role prompts (our wording, after the release's). The agents of a round are the G completions of a group: the
trainer's own rollout is the first round's solutions (under the run's prompt, the question in its answer format,
where the release uses its solver prompt with an empty discussion). The stage, first among the group stages,
then runs the rest of the discussion with the policy and builds one training row per reply, each under the prompt
it was sampled from:

* the evaluation rows: one per solution, the evaluator prompt (the problem, the solution);
* the scoring rows: one per (solution, evaluation), the scorer prompt (the problem, the solution, the evaluation);
* from round 2 on, G new solution rows per problem under the solver prompt (the problem, ``references`` of the
  previous round's discussions of it, drawn at random, in the run's prompt format, so the answer format and the
  run's reward terms apply to them), then their evaluations and scorings.

The interaction rewards are a reward column (``name``, weight ``weight``) on every row; the evaluation and scoring
rows have 0 in the run's other reward columns (they are not answers; ``reward/<term>/*`` and ``accuracy`` count
them: ``comas/solution_accuracy`` is the solutions'). The run's own terms must not train (``label_term`` at weight
0: reward=label_free); they are logged. Rows are ordered round by round, solutions, evaluations, scorings; every
(round, role, problem) block is its own group. The evaluators and scorers of the release are drawn at random among
the agents; with one policy that draw changes nothing. Role prompts are a single user message (the release's); a
quoted solution or evaluation that would take a prompt past the run's limit keeps its end.

Stats: ``comas/solution_score_mean`` (the normalised score (s − 1)/2 of the parsed scores, 0 when none parsed),
``comas/score_mean`` (raw s), ``comas/score_parsed``, ``comas/score_parse_failures`` (with ``comas/score_missing``,
``comas/score_malformed``, ``comas/score_out_of_range``), ``comas/rows_by_role/{solution,evaluation,scoring}``
(the rows that train), ``comas/{solution,evaluation,scoring}_reward_mean``, ``comas/solution_score_round<r>``,
``comas/solution_accuracy`` and ``comas/accuracy_round<r>`` (the ``label_term`` of the solutions, when it is a
term), ``comas/clipped_prompts``, ``time/comas_generate_s`` (the round-2 solutions' scoring goes to
``time/reward_s``).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence

import torch

from rlexp.algorithms.group_stages.base import append_reward_column, refuse_trained_label
from rlexp.algorithms.group_stages.demonstrations import _align_extras, _groups
from rlexp.algorithms.group_stages.guidance import _require, rollout_questions
from rlexp.core.batch import RolloutBatch
from rlexp.core.registry import GROUP_STAGES
from rlexp.rewards.interaction import (
    FAILURE_REWARDS,
    MALFORMED,
    MISSING,
    OUT_OF_RANGE,
    PARSED,
    SCORE_SCALE,
    SCORE_TAG,
    check_scale,
    interaction_rewards,
    normalised_score,
    parse_interaction_score,
)
from rlexp.rewards.judges import compile_pattern

# our wording, after the release's prompts (marti/worlds/workflows/comas.py, its "math" task)
SOLVER_TEMPLATE = (
    "{problem}\n\n"
    "Other agents have discussed this problem. Part of their discussion, for your reference:\n"
    "{discussion}\n\n"
    "Write your own step-by-step solution to the problem."
)
DISCUSSION_TEMPLATE = "--- Discussion {index} ---\nSolution: {solution}\nEvaluation: {evaluation}"
EVALUATOR_TEMPLATE = (
    "Problem:\n{problem}\n\n"
    "A proposed solution:\n{solution}\n\n"
    "Review the solution critically: list every error or weakness you find in it, saying what is wrong and why. "
    "Be brief and to the point; do not restate the solution's reasoning."
)
SCORER_TEMPLATE = (
    "Problem:\n{problem}\n\n"
    "A proposed solution:\n{solution}\n\n"
    "A review of the solution:\n{evaluation}\n\n"
    "Judge whether the review's criticisms hold, then score the solution with an integer from 1 to 3:\n"
    "3: the solution is fully correct and none of the criticisms holds;\n"
    "2: some minor criticisms hold, but the solution is still correct overall;\n"
    "1: a criticism that holds is fatal: the solution's answer is wrong.\n"
    "Give your reasons in a sentence or two, then the score between <score> and </score> tags, for example:\n"
    "The slip the review points out changes the final answer.\n"
    "<score>1</score>"
)
ROLES = ("solution", "evaluation", "scoring")
_QUOTE_MARGIN = 8  # tokens kept free for the "..." of a cut quote and re-tokenisation at the cut


def quote_cap(lengths: Sequence[int], budget: int) -> int:
    """The largest c ≥ 0 with Σ min(len_j, c) ≤ ``budget``: each quote keeps at most its last c tokens, so the
    longest ones are cut first and the short ones stay whole (0: even empty quotes overrun the budget)."""
    if budget <= 0 or not lengths:
        return 0
    if sum(lengths) <= budget:
        return max(lengths)
    ordered = sorted(lengths)
    spent = 0
    for k, n in enumerate(ordered):
        left = len(ordered) - k  # quotes of length ≥ n
        if spent + n * left > budget:
            return (budget - spent) // left
        spent += n
    return max(lengths)


def fit_quotes(
    tokenizer, compose: Callable[[list[str]], str], render: Callable[[str], str], quotes: list[str], limit: int | None
) -> tuple[str, bool]:
    """(text, cut): ``compose(quotes)`` whose rendered prompt ``render(text)`` fits ``limit`` tokens, the quotes cut
    from their start (``quote_cap``) when it does not (best effort when the rest alone is over it)."""
    text = compose(quotes)
    if limit is None:
        return text, False
    n = len(tokenizer(render(text), add_special_tokens=False)["input_ids"])
    if n <= limit:
        return text, False
    ids = [tokenizer(q, add_special_tokens=False)["input_ids"] for q in quotes]
    over = n - limit + _QUOTE_MARGIN
    for _ in range(8):
        cap = quote_cap([len(x) for x in ids], sum(len(x) for x in ids) - over)
        cut = [
            q if len(x) <= cap else "..." + (tokenizer.decode(x[len(x) - cap :]).lstrip("\ufffd") if cap else "")
            for q, x in zip(quotes, ids)
        ]
        text = compose(cut)
        m = len(tokenizer(render(text), add_special_tokens=False)["input_ids"])
        if m <= limit or cap == 0:
            return text, True
        over += m - limit
    return text, True


def render_discussion(entries: Sequence[tuple[str, str]], template: str = DISCUSSION_TEMPLATE) -> str:
    """The discussion shown to the next round's solvers: each (solution, evaluation), numbered from 1."""
    return "\n\n".join(
        template.format(index=k + 1, solution=s.strip(), evaluation=e.strip()) for k, (s, e) in enumerate(entries)
    )


def _check_template(template: str, fields: Sequence[str], key: str) -> None:
    missing = [f for f in fields if "{" + f + "}" not in template]
    if missing:
        raise ValueError(f"{key} lacks {', '.join('{' + f + '}' for f in missing)}")
    try:
        template.format(**{f: "x" for f in fields})
    except (KeyError, IndexError, ValueError) as e:
        raise ValueError(f"{key}: the template has a field other than {list(fields)} ({e!r})") from e


@GROUP_STAGES.register
class Discussion:
    """CoMAS: the policy plays solver, evaluator and scorer of a discussion of each problem; each reply is a row
    rewarded by the interaction rewards (see the module doc). Put it first among the group stages.

    ``rounds``: discussion rounds (the release's ``num_rounds`` 2); ``references``: earlier discussions shown to a
    later round's solvers (``num_references`` 2). ``label_term``: the run's verifier term, which must not train
    (weight 0; null: no check) and is logged on the solutions. ``name``, ``weight``: the interaction reward's column.
    ``solver_template`` ({problem}, {discussion}; in the run's prompt format), ``discussion_template`` ({index},
    {solution}, {evaluation}), ``evaluator_template`` ({problem}, {solution}), ``scorer_template`` ({problem},
    {solution}, {evaluation}): the role prompts. ``score_pattern``: the score's regex (group 1), the last match read;
    ``scale``: the score's integer range (1–3); ``failure_rewards``: (solution, evaluation, scoring) rewards when the
    score does not parse (0, 0, −1). ``train_roles``: the roles whose rows join the batch (all three in the release).
    ``seed``: the draw of the discussions shown (with the step)."""

    needs_reference = False

    def __init__(
        self,
        rounds: int = 2,
        references: int = 2,
        label_term: str | None = "accuracy",
        name: str = "interaction",
        weight: float = 1.0,
        solver_template: str = SOLVER_TEMPLATE,
        discussion_template: str = DISCUSSION_TEMPLATE,
        evaluator_template: str = EVALUATOR_TEMPLATE,
        scorer_template: str = SCORER_TEMPLATE,
        score_pattern: str = SCORE_TAG,
        scale: Sequence[int] = SCORE_SCALE,
        failure_rewards: Sequence[float] = FAILURE_REWARDS,
        train_roles: Sequence[str] = ROLES,
        seed: int = 0,
    ):
        where = "algorithm.group_stages: Discussion"
        if not isinstance(rounds, int) or rounds < 1:
            raise ValueError(f"{where}.rounds={rounds!r} must be an integer >= 1")
        if not isinstance(references, int) or references < 1:
            raise ValueError(f"{where}.references={references!r} must be an integer >= 1")
        if not name:
            raise ValueError(f"{where}.name is empty: the interaction reward's column needs a name")
        _check_template(solver_template, ("problem", "discussion"), f"{where}.solver_template")
        _check_template(discussion_template, ("index", "solution", "evaluation"), f"{where}.discussion_template")
        _check_template(evaluator_template, ("problem", "solution"), f"{where}.evaluator_template")
        _check_template(scorer_template, ("problem", "solution", "evaluation"), f"{where}.scorer_template")
        self.pattern = compile_pattern(score_pattern, f"{where}.score_pattern")
        self.scale = check_scale(scale, f"{where}.scale")
        failure = [float(x) for x in failure_rewards]
        if len(failure) != 3:
            raise ValueError(f"{where}.failure_rewards={failure}: three rewards (solution, evaluation, scoring)")
        roles = list(train_roles)
        unknown = [r for r in roles if r not in ROLES]
        if unknown or not roles or len(set(roles)) != len(roles):
            raise ValueError(f"{where}.train_roles={roles}: a non-empty subset of {list(ROLES)}")
        self.rounds, self.references = rounds, references
        self.label_term, self.name, self.weight = label_term, name, float(weight)
        self.solver_template, self.discussion_template = solver_template, discussion_template
        self.evaluator_template, self.scorer_template = evaluator_template, scorer_template
        self.failure_rewards, self.train_roles, self.seed = tuple(failure), tuple(roles), int(seed)

    # ---- checks ---------------------------------------------------------------------------------
    def _check(self, batch: RolloutBatch, ctx) -> None:
        _require(ctx, ("policy", "tokenizer", "rollout", "reward_terms", "prompt_format"), "Discussion", "discuss")
        if getattr(ctx.rollout, "needs_records", False):
            raise ValueError(
                "algorithm.group_stages: Discussion samples single replies (solutions, evaluations, scorings): run it "
                f"with a single-turn rollout (rollout=hf), not {type(ctx.rollout).__name__}"
            )
        if batch.rewards is None or list(batch.reward_names) != list(ctx.reward_terms):
            raise ValueError(
                "algorithm.group_stages: Discussion adds rows scored by the run's reward terms and needs the batch's "
                f"reward columns to be the terms' ({batch.reward_names} vs {list(ctx.reward_terms)}): put it first "
                "among the group stages"
            )
        refuse_trained_label(batch, self.label_term, "Discussion (CoMAS)")

    # ---- the stage ------------------------------------------------------------------------------
    def __call__(self, batch: RolloutBatch, ctx) -> RolloutBatch:
        if len(batch) == 0:
            return batch
        self._check(batch, ctx)
        step = int(getattr(ctx, "step", 1) or 1)
        rng = random.Random(f"{self.seed}:{step}")
        groups = _groups(batch)
        records = [batch.records[rows[0]] for rows in groups]
        problems = [str(r.get("question", batch.prompts[rows[0]])) for r, rows in zip(records, groups)]
        sizes = [len(rows) for rows in groups]
        limit = getattr(getattr(ctx.prompt_format, "limit", None), "limit", None)
        timing = {"generate": 0.0, "reward": 0.0}
        self._next_gid = int(batch.group_ids.max()) + 1
        self._clipped = 0
        parts: list[tuple[str, RolloutBatch, list[float]]] = []
        statuses: list[str] = []
        scores: list[int] = []
        stats: dict[str, float] = {}
        accuracy: list[torch.Tensor] = []
        previous: list[list[tuple[str, str]]] = []
        solutions = batch
        for r in range(1, self.rounds + 1):
            if r > 1:
                solutions = self._solve(ctx, problems, records, sizes, previous, rng, limit, timing)
            owner = [p for p, n in enumerate(sizes) for _ in range(n)]  # the problem of each solution row
            sols = [solutions.completions[i] for i in range(len(solutions))]
            ev_texts = [
                self._fit(ctx, self.evaluator_template, problems[p], {"solution": s}, limit)
                for p, s in zip(owner, sols)
            ]
            evaluations = self._generate(ctx, ev_texts, owner, records, timing)
            sc_texts = [
                self._fit(ctx, self.scorer_template, problems[p], {"solution": s, "evaluation": e}, limit)
                for p, s, e in zip(owner, sols, evaluations.completions)
            ]
            scorings = self._generate(ctx, sc_texts, owner, records, timing)
            parsed = [parse_interaction_score(t, self.pattern, self.scale) for t in scorings.completions]
            rewards = [interaction_rewards(s, self.scale, self.failure_rewards) for s, _ in parsed]
            parts += [
                ("solution", solutions, [x[0] for x in rewards]),
                ("evaluation", evaluations, [x[1] for x in rewards]),
                ("scoring", scorings, [x[2] for x in rewards]),
            ]
            statuses += [st for _, st in parsed]
            round_scores = [s for s, _ in parsed if s is not None]
            scores += round_scores
            stats[f"comas/solution_score_round{r}"] = (
                sum(normalised_score(s, self.scale) for s in round_scores) / len(round_scores) if round_scores else 0.0
            )
            if self.label_term is not None and self.label_term in solutions.reward_names:
                acc = solutions.term(self.label_term).detach().float().cpu()
                accuracy.append(acc)
                stats[f"comas/accuracy_round{r}"] = float(acc.mean())
            previous = [[] for _ in problems]
            for p, s, e in zip(owner, sols, evaluations.completions):
                previous[p].append((s, e))
        out = self._assemble(batch, parts)
        stats.update(self._stats(parts, statuses, scores, accuracy))
        stats["time/comas_generate_s"] = timing["generate"]
        out.stats = {**batch.stats, **stats}
        out.stats["time/reward_s"] = batch.stats.get("time/reward_s", 0.0) + timing["reward"]
        return out

    # ---- the discussion's replies ------------------------------------------------------------------
    def _solve(self, ctx, problems, records, sizes, previous, rng, limit, timing) -> RolloutBatch:
        """A later round's solutions: for each problem, G (its group's size) replies to the solver prompt showing
        ``references`` of the previous round's discussions of it (drawn at random), scored by the run's terms."""
        tok, fmt = ctx.tokenizer, ctx.prompt_format
        questions = []
        for p, problem in enumerate(problems):
            shown = rng.sample(previous[p], min(self.references, len(previous[p])))
            flat = [x for pair in shown for x in pair]

            def compose(quotes, problem=problem):
                pairs = list(zip(quotes[0::2], quotes[1::2]))
                discussion = render_discussion(pairs, self.discussion_template)
                return self.solver_template.format(problem=problem.strip(), discussion=discussion)

            text, cut = fit_quotes(tok, compose, lambda q: fmt.render_full(tok, q), flat, limit)
            self._clipped += int(cut)
            questions.append(text)
        by_size: dict[int, list[int]] = {}
        for p, n in enumerate(sizes):
            by_size.setdefault(n, []).append(p)
        gids = [self._new_gid() for _ in problems]
        pieces: dict[int, RolloutBatch] = {}
        for n, ps in by_size.items():
            rolled = rollout_questions(
                ctx, [gids[p] for p in ps], [questions[p] for p in ps], [records[p] for p in ps], n, timing
            )
            for k, p in enumerate(ps):
                pieces[p] = rolled.select(list(range(k * n, (k + 1) * n)))
        out = pieces[0] if len(problems) == 1 else RolloutBatch.concat([pieces[p] for p in range(len(problems))])
        return out

    def _fit(self, ctx, template: str, problem: str, quoted: dict[str, str], limit: int | None) -> str:
        """A role prompt (one user message) with ``quoted`` texts cut from their start where it passes ``limit``."""
        tok, keys = ctx.tokenizer, list(quoted)

        def compose(quotes):
            return template.format(problem=problem.strip(), **{k: q.strip() for k, q in zip(keys, quotes)})

        text, cut = fit_quotes(tok, compose, lambda m: _chat(tok, m), [quoted[k] for k in keys], limit)
        self._clipped += int(cut)
        return _chat(tok, text)

    def _generate(self, ctx, prompts: list[str], owner: list[int], records: list[dict], timing: dict) -> RolloutBatch:
        """One reply per rendered role prompt, by the policy at the rollout's settings: a batch whose rows of one
        problem form a new group, with the run's reward columns at 0 (not scored: these rows are no answers)."""
        dtype = getattr(ctx, "autocast_dtype", None)
        device = next(ctx.policy.parameters()).device
        t0 = time.perf_counter()
        with torch.autocast(device.type, dtype=dtype or torch.bfloat16, enabled=dtype is not None):
            out = ctx.rollout.generate(ctx.policy, ctx.tokenizer, prompts, num_generations=1)
        timing["generate"] += time.perf_counter() - t0
        gid_of = {p: self._new_gid() for p in dict.fromkeys(owner)}
        gids = torch.tensor([gid_of[p] for p in owner], dtype=torch.long, device=out.completion_ids.device)
        rows = RolloutBatch.from_generation(out, gids, list(prompts), [records[p] for p in owner])
        n, names = len(rows), list(ctx.reward_terms)
        rows.rewards = torch.zeros(n, len(names))
        rows.reward_failures = torch.zeros(n, len(names), dtype=torch.bool)
        rows.reward_names = names
        rows.reward_weights = torch.tensor([float(getattr(t, "weight", 1.0)) for t in ctx.reward_terms.values()])
        rows.reward = torch.zeros(n)
        return rows

    def _new_gid(self) -> int:
        self._next_gid += 1
        return self._next_gid - 1

    # ---- the batch and its statistics -----------------------------------------------------------
    def _assemble(self, batch: RolloutBatch, parts) -> RolloutBatch:
        """The rows of the trained roles, in discussion order, with the interaction reward column."""
        kept = [(role, rows, r) for role, rows, r in parts if role in self.train_roles]
        pieces = []
        for _, rows, _ in kept:
            rows.rewards = rows.rewards.to(device=batch.rewards.device, dtype=batch.rewards.dtype)
            rows.reward = rows.reward.to(device=batch.reward.device, dtype=batch.reward.dtype)
            rows.reward_weights = batch.reward_weights
            rows.reward_failures = rows.reward_failures.to(batch.rewards.device)
            pieces.append(rows)
        for a in pieces:  # the same per-row extras on every piece (a key one lacks: 0, loss weights 1)
            for b in pieces:
                if a is not b:
                    _align_extras(a, b)
        out = pieces[0] if len(pieces) == 1 else RolloutBatch.concat(pieces)
        column = torch.tensor([x for _, _, r in kept for x in r], dtype=torch.float32)
        return append_reward_column(out, self.name, column, self.weight)

    def _stats(self, parts, statuses: list[str], scores: list[int], accuracy: list[torch.Tensor]) -> dict:
        stats: dict[str, float] = {}
        for role in ROLES:
            values = [x for r, _, rs in parts if r == role for x in rs]
            stats[f"comas/rows_by_role/{role}"] = float(len(values)) if role in self.train_roles else 0.0
            stats[f"comas/{role}_reward_mean"] = sum(values) / len(values) if values else 0.0
        stats["comas/score_parsed"] = float(statuses.count(PARSED))
        stats["comas/score_parse_failures"] = float(len(statuses) - statuses.count(PARSED))
        stats["comas/score_missing"] = float(statuses.count(MISSING))
        stats["comas/score_malformed"] = float(statuses.count(MALFORMED))
        stats["comas/score_out_of_range"] = float(statuses.count(OUT_OF_RANGE))
        stats["comas/solution_score_mean"] = (
            sum(normalised_score(s, self.scale) for s in scores) / len(scores) if scores else 0.0
        )
        stats["comas/score_mean"] = sum(scores) / len(scores) if scores else 0.0
        if accuracy:
            stats["comas/solution_accuracy"] = float(torch.cat(accuracy).mean())
        stats["comas/clipped_prompts"] = float(self._clipped)
        return stats


def _chat(tokenizer, message: str) -> str:
    """A role prompt: ``message`` as the single user turn of the chat template, with the assistant's opening."""
    return tokenizer.apply_chat_template(
        [{"role": "user", "content": message}], add_generation_prompt=True, tokenize=False
    )
