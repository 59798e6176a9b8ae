"""Summarisation-based context management for multi-turn episodes: SUPO ("Scaling LLM Multi-turn RL with End-to-end
Summarization-based Context Management", Lu et al., 2025, arXiv 2510.06727; issue 28).

An episode unrolls as in ``rlexp.rollout.multi_turn`` (policy turns, tool results in between, under the chat
template), but its *working context* — the tokens after the prompt that the policy sees — is bounded by
``working_context`` (the paper's L). When a turn and its tool result would take the working context to L or past it
(or the turn itself is cut by the room left), that turn and its result are dropped (the paper's Algorithm 2; the tool
has run — our tools are stateless, a game's state is not rewound), a summarisation instruction is added as a user
message, and the policy's next turn is a *summary* of its work so far. The context then restarts as the prompt and
the summary (a user message rendered from ``restart_template``; after the environment's first observation, if it
gave one), and the episode goes on. At most ``max_summaries``
summaries: an overflow after the last one ends the episode *overlong*.

Each stretch between restarts is a *segment*, and each segment becomes one row of the training batch (the paper's
policy-gradient decomposition: the episode's gradient is the sum over its segments, each a complete trajectory of its
own context): a row's prompt is the task's prompt, its completion the segment — the restart message (environment
tokens, attended, out of the loss), the policy's turns and the tool results, and, for every segment but the last, the
summarisation instruction (environment tokens) and the summary (policy tokens: summaries are trained end to end with
the rest). A row's sampling log-probs are those of its tokens in its own context, so the loss is exact.

Every row of an episode carries the episode's text (its policy turns, summaries included, joined by newlines: the
final answer is the last turn), so the reward terms give all its rows the episode's outcome; the SUPO advantage
(``rlexp.algorithms.advantages.segments.supo``) normalises over the episodes of a group, not over their rows, and
gives each row its episode's advantage. An *unfinished* episode — overlong after ``max_summaries``, a turn cut at
its token limit, or the turn limit reached without a final answer — has every row marked ``truncated``; the
``overlong_mask`` stage then takes them out of the loss (the paper's overlong masking), their reward still in the
group statistics.

The trainer asks for segment rows (``generate(..., segment_rows=True)``: the output's ``row_episodes`` maps each row
to its episode, record-major as single-turn rows) and gives each row its episode's group, prompt and record. Other
callers (evaluation, SFT data, group stages) get one row per episode — its last segment, with the episode's text.

Each row's ``record["episode"]``: the episode's ``turns`` (policy turns kept, summaries included), ``rewards``,
``reward``, counters, ``truncated``, ``turn_limit``, ``overlong``, ``summaries``, ``segments``, ``episode_index`` (the
episode's place in the call), and the row's own ``segment`` (0-based), ``turn_ends`` and ``states``.

Metrics (means over the step's episodes): ``supo/summaries``, ``supo/segments``, ``supo/rows`` (rows in the
batch), ``supo/overlong_frac``, ``supo/discarded_turns``, ``supo/summary_tokens`` (mean tokens of a summary),
``supo/summaries_cut`` (share of summaries that hit ``max_summary_tokens``: kept as cut), ``supo/working_context_max``
(the longest segment, tokens after the prompt), and the ``episode/*`` of ``multi_turn`` over whole episodes."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from rlexp.rollout.hf import RolloutOutput
from rlexp.rollout.multi_turn import COUNTERS, Episode, MultiTurnRollout, _left_pad, observation_template, state_key

SUMMARY_INSTRUCTION = (
    "Your working context is full. Summarise your work so far: the task, what you found with the tools, and what "
    "is left to do. Do not call a tool in this turn."
)
RESTART_TEMPLATE = "Summary of your work so far:\n{summary}\nContinue the task from this summary."


@dataclass
class SegmentedOutput(RolloutOutput):
    """A rollout's output with several rows per episode: ``row_episodes[r]`` is the episode (record-major, as the
    rows of a single-turn rollout) that row ``r`` belongs to."""

    row_episodes: list[int] | None = None


@dataclass
class _Run:
    """One episode as it unrolls: its closed segments, the current one, and the episode's own tallies."""

    prompt_ids: list[int]
    env: object
    intro: list[int] = field(default_factory=list)  # the environment's first observation (part of the state s_1)
    seg: Episode = None  # the current segment (an Episode of rlexp.rollout.multi_turn: tokens after the prompt)
    closed: list[Episode] = field(default_factory=list)
    summarizing: bool = False  # the next turn is a summary
    turns: int = 0  # regular turns sampled (dropped ones included)
    summaries: int = 0
    summaries_cut: int = 0
    summary_tokens: int = 0
    discarded: int = 0
    texts: list[str] = field(default_factory=list)  # the policy's kept turns and summaries, in order
    rewards: list[float] = field(default_factory=list)  # every environment step's reward
    counters: dict = field(default_factory=dict)
    done: bool = False
    truncated: bool = False  # unfinished: overlong, a cut turn, or the turn limit
    overlong: bool = False
    turn_limit: bool = False

    @property
    def segments(self) -> list[Episode]:
        return [*self.closed, self.seg]

    def count(self, info: dict) -> None:
        for key, v in info.items():
            self.counters[key] = self.counters.get(key, 0) + v


class SummarizingRollout(MultiTurnRollout):
    """SUPO's rollout (module doc): multi-turn episodes whose working context is at most ``working_context`` tokens
    after the prompt (default the engine's ``max_new_tokens``), summarised and restarted when full, at most
    ``max_summaries`` times, each summary at most ``max_summary_tokens``; ``max_turns`` regular turns in all (dropped
    ones included), each at most ``max_turn_tokens``. ``summary_instruction``: the user message that asks for the
    summary; ``restart_template``: the user message the restarted context opens with (``{summary}`` is replaced by
    the summary's text); ``summary_role``: the chat role of both."""

    segment_rows = True  # the trainer asks for one row per segment (generate's segment_rows)

    def __init__(
        self,
        engine,
        environment,
        max_turns: int = 8,
        max_turn_tokens: int | None = None,
        working_context: int | None = None,
        max_summaries: int = 2,
        max_summary_tokens: int = 128,
        summary_instruction: str = SUMMARY_INSTRUCTION,
        restart_template: str = RESTART_TEMPLATE,
        summary_role: str = "user",
    ):
        if working_context is not None and working_context < 1:
            raise ValueError(
                f"rollout.working_context must be >= 1 (or null: the engine's max_new_tokens), got {working_context}"
            )
        super().__init__(engine, environment, max_turns, max_turn_tokens, working_context)
        if max_summaries < 0:
            raise ValueError(f"rollout.max_summaries must be >= 0, got {max_summaries}")
        if max_summary_tokens < 1:
            raise ValueError(f"rollout.max_summary_tokens must be >= 1, got {max_summary_tokens}")
        if not str(summary_instruction).strip():
            raise ValueError("rollout.summary_instruction is empty: it is the message that asks for the summary")
        if "{summary}" not in restart_template:
            raise ValueError(f"rollout.restart_template must contain '{{summary}}', got {restart_template!r}")
        self.max_summaries, self.max_summary_tokens = max_summaries, max_summary_tokens
        self.summary_instruction, self.restart_template = str(summary_instruction), str(restart_template)
        self.summary_role = summary_role
        self._user_templates: dict[int, tuple[str, str]] = {}

    @property
    def working_context(self) -> int:
        return self.max_episode_tokens

    def _message_ids(self, tokenizer, text: str) -> list[int]:
        """``text`` as a ``summary_role`` message closing the open (empty) assistant turn the context ends with:
        the turn's end (EOS), the message, and the next assistant header."""
        key = id(tokenizer)
        if key not in self._user_templates:
            self._user_templates[key] = observation_template(tokenizer, self.summary_role)
        before, after = self._user_templates[key]
        return tokenizer((tokenizer.eos_token or "") + before + text + after, add_special_tokens=False)["input_ids"]

    def _new_segment(self, run: _Run, tokenizer, summary: str | None, anchor: str) -> None:
        run.seg = Episode(run.prompt_ids)
        run.seg.anchor = state_key(anchor)
        if summary is not None:  # the restart: the prompt (and the environment's first observation), the summary
            text = self.restart_template.replace("{summary}", summary)
            if run.intro:
                run.seg.add(run.intro, policy=False)
            run.seg.add(self._message_ids(tokenizer, text), policy=False)
            run.seg.anchor = state_key(text)

    def _overflow(self, run: _Run, tokenizer, dropped_turn: bool = True) -> None:
        """The working context is full: ask for a summary, or end the episode overlong after the last one."""
        run.discarded += int(dropped_turn)
        if run.summaries >= self.max_summaries:
            run.done = run.truncated = run.overlong = True
            return
        run.seg.add(self._message_ids(tokenizer, self.summary_instruction), policy=False)
        run.seg.anchor = state_key(self.summary_instruction)
        run.summarizing = True

    @torch.no_grad()
    def generate(
        self,
        model,
        tokenizer,
        prompts: list[str],
        num_generations: int = 1,
        greedy: bool = False,
        max_new_tokens: int | None = None,
        records: list[dict] | None = None,
        segment_rows: bool = False,
        **_,
    ) -> RolloutOutput:
        """``num_generations`` episodes of each prompt; ``segment_rows``: one row per segment (the trainer's batch,
        ``SegmentedOutput.row_episodes``), else one row per episode (its last segment). ``max_new_tokens`` caps the
        working context."""
        G = num_generations
        L = min(max_new_tokens or self.working_context, self.working_context)
        turn_budget = min(self.max_turn_tokens, L)
        records = records if records is not None else [{} for _ in prompts]
        prompt_ids = tokenizer([p for p in prompts for _ in range(G)], add_special_tokens=False)["input_ids"]
        row_records = [r for r in records for _ in range(G)]
        runs = [_Run(p_ids, self.environment(r)) for p_ids, r in zip(prompt_ids, row_records)]
        for k, run in enumerate(runs):
            first = run.env.reset()
            self._new_segment(run, tokenizer, None, prompts[k // G] + (first or ""))
            if first is not None:
                run.intro = self._observation_ids(tokenizer, first)
                run.seg.add(run.intro, policy=False)
        device = next(model.parameters()).device
        pad = tokenizer.pad_token_id
        # each round every active episode takes one turn (a regular one or a summary): bounded by both limits
        for _round in range(self.max_turns + self.max_summaries + 1):
            limits = {}
            for i, run in enumerate(runs):
                if run.done:
                    continue
                if not run.summarizing and run.turns >= self.max_turns:  # its last turn was dropped (overflow)
                    run.done = run.truncated = run.turn_limit = True
                    continue
                room = L - len(run.seg.tokens)
                if not run.summarizing and room < 1:  # no room left for a turn: summarise (or end overlong)
                    self._overflow(run, tokenizer, dropped_turn=False)
                    if run.done:
                        continue
                limits[i] = self.max_summary_tokens if run.summarizing else min(turn_budget, room)
            if not limits:
                break
            active = list(limits)
            ids, mask = _left_pad([runs[i].prompt_ids + runs[i].seg.tokens for i in active], pad, device)
            out = self.engine.generate_from_ids(model, tokenizer, ids, mask, max(limits.values()), greedy=greedy)
            for k, i in enumerate(active):
                run, lim = runs[i], limits[i]
                n = int(out.completion_mask[k].sum())
                complete = n <= lim and not bool(out.truncated[k])
                n = min(n, lim)
                toks = out.completion_ids[k, :n].tolist()
                lps = out.logprobs[k, :n].float().tolist()
                text = out.texts[k] if complete else tokenizer.decode(toks, skip_special_tokens=True)
                if run.summarizing:
                    self._summary(run, tokenizer, toks, lps, text, complete)
                else:
                    self._turn(run, tokenizer, toks, lps, text, complete, lim < turn_budget, L)
        for run in runs:  # the round bound was reached (it cannot be while limits hold; kept as a guard)
            if not run.done:
                run.done = run.truncated = run.turn_limit = True
        return self._segmented_output(tokenizer, runs, device, segment_rows)

    def _keep(self, run: _Run, toks: list[int], lps: list[float], text: str) -> None:
        seg = run.seg
        seg.states.append(seg.anchor)
        seg.add(toks, policy=True, logprobs=lps)
        seg.texts.append(text)
        seg.turn_ends.append(len(seg.tokens) - 1)
        run.texts.append(text)

    def _summary(self, run: _Run, tokenizer, toks, lps, text: str, complete: bool) -> None:
        """The summary closes its segment (a summary cut at ``max_summary_tokens`` is kept as cut: our choice)."""
        self._keep(run, toks, lps, text)
        run.summaries += 1
        run.summaries_cut += int(not complete)
        run.summary_tokens += len(toks)
        run.summarizing = False
        run.closed.append(run.seg)
        self._new_segment(run, tokenizer, text.strip(), "")

    def _turn(self, run: _Run, tokenizer, toks, lps, text: str, complete: bool, room_bound: bool, L: int) -> None:
        run.turns += 1
        if not complete:
            if room_bound:  # cut by the working context's room, not by the turn's own limit: the context is full
                self._overflow(run, tokenizer)
                return
            self._keep(run, toks, lps, text)  # cut at max_turn_tokens: no complete message to answer
            run.seg.turn_ends.pop()  # as multi_turn: a cut turn has no turn end (it was never stepped)
            run.done = run.truncated = True
            return
        step = run.env.step(text)
        run.count(step.info)
        run.rewards.append(float(step.reward))
        if step.done or step.observation is None:
            self._keep(run, toks, lps, text)
            run.done = True
            return
        if run.turns >= self.max_turns:
            self._keep(run, toks, lps, text)
            run.done = run.truncated = run.turn_limit = True
            return
        obs = self._observation_ids(tokenizer, step.observation)
        if len(run.seg.tokens) + len(toks) + len(obs) >= L:  # the turn and its result would fill the context
            self._overflow(run, tokenizer)
            return
        self._keep(run, toks, lps, text)
        run.seg.add(obs, policy=False)
        run.seg.anchor = state_key(step.observation)

    def _record(self, run: _Run, index: int, seg: Episode, k: int) -> dict:
        return {
            "turns": len(run.texts),
            "rewards": list(run.rewards),
            "reward": float(sum(run.rewards)),
            "truncated": run.truncated,
            "turn_limit": run.turn_limit,
            "overlong": run.overlong,
            **dict.fromkeys(COUNTERS, 0),
            **run.counters,
            "summaries": run.summaries,
            "segments": len(run.segments),
            "episode_index": index,
            "segment": k,
            "turn_ends": list(seg.turn_ends),
            "states": list(seg.states),
        }

    def _segmented_output(self, tokenizer, runs: list[_Run], device, segment_rows: bool) -> RolloutOutput:
        rows = [(i, k, seg) for i, run in enumerate(runs) for k, seg in enumerate(run.segments)]
        if not segment_rows:
            rows = [(i, len(run.segments) - 1, run.seg) for i, run in enumerate(runs)]
        segs = [seg for _, _, seg in rows]
        pad = tokenizer.pad_token_id
        p_ids, p_mask = _left_pad([seg.prompt_ids for seg in segs], pad, device)
        n, width = len(segs), max(1, max(len(seg.tokens) for seg in segs))
        ids = torch.full((n, width), pad, dtype=torch.long)
        mask = torch.zeros((n, width), dtype=torch.long)
        policy = torch.zeros((n, width), dtype=torch.float32)
        logprobs = torch.zeros((n, width), dtype=torch.float32)
        for r, seg in enumerate(segs):
            t = len(seg.tokens)
            if t:
                ids[r, :t] = torch.tensor(seg.tokens, dtype=torch.long)
                mask[r, :t] = 1
                policy[r, :t] = torch.tensor(seg.policy, dtype=torch.float32)
                logprobs[r, :t] = torch.tensor(seg.logprobs, dtype=torch.float32)
        texts = ["\n".join(run.texts) for run in runs]
        return SegmentedOutput(
            p_ids,
            p_mask,
            ids.to(device),
            mask.to(device),
            logprobs.to(device),
            torch.tensor([runs[i].truncated for i, _, _ in rows], device=device),
            [texts[i] for i, _, _ in rows],
            stats={**self.metrics(runs), "supo/rows": float(n)},
            policy_tokens=policy.to(device),
            episodes=[self._record(runs[i], i, seg, k) for i, k, seg in rows],
            row_episodes=[i for i, _, _ in rows] if segment_rows else None,
        )

    @staticmethod
    def metrics(runs: list[_Run]) -> dict[str, float]:
        n = max(1, len(runs))

        def mean(f) -> float:
            return float(sum(f(r) for r in runs) / n)

        summaries = sum(r.summaries for r in runs)
        return {
            "episode/turns": mean(lambda r: len(r.texts)),
            "episode/tool_calls": mean(lambda r: r.counters.get("tool_calls", 0)),
            "episode/tool_errors": mean(lambda r: r.counters.get("tool_errors", 0)),
            "episode/malformed_calls": mean(lambda r: r.counters.get("malformed_calls", 0)),
            "episode/env_reward": mean(lambda r: sum(r.rewards)),
            "episode/length": mean(lambda r: sum(len(s.tokens) for s in r.segments)),
            "episode/policy_tokens": mean(lambda r: sum(sum(s.policy) for s in r.segments)),
            "episode/turn_limit_frac": mean(lambda r: float(r.turn_limit)),
            "episode/truncated_frac": mean(lambda r: float(r.truncated)),
            "supo/summaries": mean(lambda r: r.summaries),
            "supo/segments": mean(lambda r: len(r.segments)),
            "supo/overlong_frac": mean(lambda r: float(r.overlong)),
            "supo/discarded_turns": mean(lambda r: r.discarded),
            "supo/summary_tokens": float(sum(r.summary_tokens for r in runs) / max(1, summaries)),
            "supo/summaries_cut": float(sum(r.summaries_cut for r in runs) / max(1, summaries)),
            "supo/working_context_max": float(max([0] + [len(s.tokens) for r in runs for s in r.segments])),
        }
