"""ARPO's entropy-based adaptive rollout ("Agentic Reinforced Policy Optimization", Dong et al., 2025, arXiv
2507.19849, §3.1; released code dongguanting/ARPO, ``verl_arpo_entropy/verl/workers/rollout/vllm_rollout/
vllm_rollout_with_tools.py``: ``generate_sequences``): multi-turn episodes (``rlexp.rollout.multi_turn``) that
branch where the policy grows uncertain after a tool's result.

A group of G = ``num_generations`` rows per prompt is the budget. ``initial_rollouts`` M episodes start from the
prompt (the global samples; null: G/2, the released scripts' 8 of 16). Each turn's first k = ``entropy_tokens``
tokens are scored by the policy (a forward over the context and those tokens, at the sampling temperature): H is the
sum of their full-vocabulary entropies. An episode's first turn sets its reference H⁰; each later turn — the turn
after an observation, a tool's result — gives the entropy rise ΔH = (H − H⁰) / ln |V|. Then, ``branches`` Z times,
while the prompt's group has room: with probability clip(α + β·ΔH, 0, 1) (``alpha``, ``beta``; a coin u ≤ α + β·ΔH)
a branch is made — a copy of the episode as it stood before that turn (its prompt, turns, observations, sampling
log-probs, counters and anchor states; the environment forked to the same point) that samples the turn afresh from
the next round on and goes its own way. A branch may branch again. When none of a prompt's episodes is left running
and its group is not full, fresh global episodes fill it (``refill``: ``all`` at once, the paper's supplement; ``one``
per round, the released code's). Every row is a whole episode (a branch is its prefix, shared token for token with
its parent, plus its own continuation), and a group holds only its prompt's episodes, in the order they were made.

Each row's record carries ``record["episode"]["branch"]`` = {index (its place in the group), parent (the index of
the episode it branched from; None: a global episode), shared (completion tokens copied from the parent)} for the
advantage's attribution (``rlexp.algorithms.advantages.branching``).

Greedy calls (evaluation) and groups with no room for a branch (M ≥ G) roll out plain multi-turn episodes.

Environment forks: ``fork()`` when the episode object has one; tool-use episodes keep no state of their own (each
call runs in a fresh sandbox process), so a fresh episode of the record; otherwise a fresh episode replayed with the
prefix's turns (right for deterministic environments: TextWorld's games).

Metrics of the step's rollout: ``arpo/branches`` (branch rows per prompt), ``arpo/branch_frac`` (of all rows),
``arpo/refills`` (global episodes added after the first M, per prompt), ``arpo/branch_points`` (turns at which a
branch was considered, per prompt), ``arpo/entropy_rise_mean`` and ``arpo/branch_prob_mean`` (ΔH and clip(α + β·ΔH)
at those turns; 0 without any), ``arpo/initial_entropy_mean`` (H⁰), ``arpo/shared_token_frac`` (completion tokens
copied from a parent); ``episode/*`` as ``rlexp.rollout.multi_turn``. A turn shorter than k sums fewer entropies
(as the released code's), so a short turn after a long first one shows a fall."""

from __future__ import annotations

import copy
import math
import random
from dataclasses import dataclass

import torch

from rlexp.core.forward import token_logprobs
from rlexp.environments.tool_use import ToolUseEpisode
from rlexp.rollout.hf import RolloutOutput
from rlexp.rollout.multi_turn import Episode, MultiTurnRollout, _left_pad

REFILLS = ("all", "one")


def entropy_rise(entropy: float, initial: float, vocab_size: int) -> float:
    """ΔH = (H − H⁰) / ln |V|: the rise of a turn's summed first-token entropies over the episode's first turn's."""
    return (float(entropy) - float(initial)) / math.log(max(2, int(vocab_size)))


def branch_probability(rise: float, alpha: float, beta: float) -> float:
    """clip(α + β·ΔH, 0, 1): the chance that one coin makes a branch."""
    return min(1.0, max(0.0, alpha + beta * rise))


def should_branch(u: float, rise: float, alpha: float, beta: float) -> bool:
    """One coin u ~ U[0, 1): a branch when u ≤ α + β·ΔH (the released code: skip when clip(u − β·ΔH, 0, 1) > α)."""
    return u <= alpha + beta * rise


@dataclass
class BranchEpisode(Episode):
    """An episode of a branching group: its prompt (``group``), its place in the group (``index``), the episode it
    branched from (``parent``, None: a global episode) and how many completion tokens it copied from it (``shared``),
    and the reference entropy H⁰ of its line's first turn (None: not measured yet)."""

    group: int = 0
    index: int = 0
    parent: int | None = None
    shared: int = 0
    first_entropy: float | None = None

    def record(self) -> dict:
        out = super().record()
        out["branch"] = {"index": self.index, "parent": self.parent, "shared": self.shared}
        return out


def fork_environment(env, factory, record: dict, texts: list[str]):
    """A copy of the environment episode ``env`` at the point where the policy's turns ``texts`` were answered (see
    the module doc): ``env.fork()``, a fresh tool-use episode, or a fresh episode replayed with ``texts``."""
    fork = getattr(env, "fork", None)
    if callable(fork):
        return fork()
    twin = factory(record)
    if isinstance(env, ToolUseEpisode):
        return twin
    twin.reset()
    for text in texts:
        twin.step(text)
    return twin


class BranchingRollout(MultiTurnRollout):
    """ARPO's entropy-based adaptive rollout (module doc) over ``MultiTurnRollout``'s episodes: ``initial_rollouts``
    M global episodes per prompt (null: G/2), ``branches`` Z coins per turn after an observation, each a branch with
    probability clip(``alpha`` + ``beta``·ΔH, 0, 1), ΔH from the first ``entropy_tokens`` tokens' entropies;
    ``refill`` all | one."""

    def __init__(
        self,
        engine,
        environment,
        max_turns: int = 4,
        max_turn_tokens: int | None = None,
        max_episode_tokens: int | None = None,
        initial_rollouts: int | None = None,
        branches: int = 1,
        alpha: float = 0.5,
        beta: float = 0.2,
        entropy_tokens: int = 20,
        refill: str = "all",
    ):
        super().__init__(engine, environment, max_turns, max_turn_tokens, max_episode_tokens)
        if initial_rollouts is not None and initial_rollouts < 1:
            raise ValueError(f"rollout.initial_rollouts must be >= 1 (or null: half the group), got {initial_rollouts}")
        if branches < 1:
            raise ValueError(f"rollout.branches must be >= 1, got {branches}")
        if not 0.0 <= alpha <= 1.0:
            raise ValueError(f"rollout.alpha must be in [0, 1], got {alpha}")
        if beta < 0:
            raise ValueError(f"rollout.beta must be >= 0, got {beta}")
        if entropy_tokens < 1:
            raise ValueError(f"rollout.entropy_tokens must be >= 1, got {entropy_tokens}")
        if refill not in REFILLS:
            raise ValueError(f"rollout.refill={refill!r} is not one of {list(REFILLS)}")
        self.initial_rollouts, self.branches, self.alpha, self.beta = initial_rollouts, branches, alpha, beta
        self.entropy_tokens, self.refill = entropy_tokens, refill
        self.rng = random  # the branch coins (.random()); the trainer's checkpoints keep Python's RNG state

    def initial(self, G: int) -> int:
        """M: the global episodes each prompt starts with."""
        return min(G, self.initial_rollouts or max(1, G // 2))

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
        **kw,
    ) -> RolloutOutput:
        """``num_generations`` G rows per prompt (record-major, each group in the order its episodes were made)."""
        G = num_generations
        if greedy or self.initial(G) >= G:  # evaluation, or no room for a branch: plain episodes
            out = super().generate(model, tokenizer, prompts, G, greedy, max_new_tokens, records, **kw)
            if not greedy:
                out.stats.update(_branch_metrics(len(prompts), G, 0, 0, [], [], [], 0.0))
            return out
        budget, turn_budget = self._budgets(max_new_tokens)
        records = records if records is not None else [{} for _ in prompts]
        prompt_ids = tokenizer(list(prompts), add_special_tokens=False)["input_ids"]
        device = next(model.parameters()).device
        scorer = self.engine.inference_model(model) if hasattr(self.engine, "inference_model") else model
        groups: list[list[BranchEpisode]] = [[] for _ in prompts]
        envs: dict[int, object] = {}  # id(episode) -> its environment episode

        def start(g: int) -> None:
            ep = BranchEpisode(list(prompt_ids[g]), group=g, index=len(groups[g]))
            env = self.environment(records[g])
            self._open(tokenizer, ep, env, prompts[g])
            groups[g].append(ep)
            envs[id(ep)] = env

        for g in range(len(prompts)):
            for _ in range(self.initial(G)):
                start(g)
        refills, rises, probs, firsts = 0, [], [], []
        while True:
            active = [ep for group in groups for ep in group if not ep.done]
            if not active:
                break
            out = self._sample_turn(model, tokenizer, active, turn_budget, budget, greedy)
            # the entropies of the turns whose group still has room for a branch (the others can never branch)
            scored = [k for k, ep in enumerate(active) if len(groups[ep.group]) < G]
            entropies = self._turn_entropies(scorer, tokenizer, active, out, scored) if scored else {}
            vocab = len(tokenizer)
            for k, ep in enumerate(active):
                env = envs[id(ep)]
                if k in entropies:
                    if ep.first_entropy is None:  # the line's first turn: the reference H⁰
                        ep.first_entropy = entropies[k]
                        firsts.append(entropies[k])
                    else:  # a turn after an observation: branch on the rise
                        rise = entropy_rise(entropies[k], ep.first_entropy, vocab)
                        rises.append(rise)
                        probs.append(branch_probability(rise, self.alpha, self.beta))
                        for _ in range(self.branches):
                            group = groups[ep.group]
                            if len(group) < G and should_branch(self.rng.random(), rise, self.alpha, self.beta):
                                child = copy.deepcopy(ep)  # before this turn: the turn is sampled afresh
                                child.index, child.parent, child.shared = len(group), ep.index, len(ep.tokens)
                                group.append(child)
                                envs[id(child)] = fork_environment(env, self.environment, records[ep.group], ep.texts)
                last = len(ep.texts) == self.max_turns - 1
                self._take_turn(tokenizer, ep, env, out, k, budget, last=last)
            for g, group in enumerate(groups):  # groups with nothing left running: fresh global episodes
                if len(group) < G and all(ep.done for ep in group):
                    n = G - len(group) if self.refill == "all" else 1
                    for _ in range(n):
                        start(g)
                    refills += n
        episodes = [ep for group in groups for ep in group]
        branched = sum(ep.parent is not None for ep in episodes)
        shared = sum(ep.shared for ep in episodes) / max(1, sum(len(ep.tokens) for ep in episodes))
        out = self._output(tokenizer, episodes, device)
        out.stats.update(_branch_metrics(len(prompts), G, branched, refills, rises, probs, firsts, shared))
        return out

    def _turn_entropies(self, model, tokenizer, eps: list[Episode], out: RolloutOutput, rows: list[int]):
        """{k: H} for the rows ``rows`` of the engine's ``out``: the sum of the full-vocabulary entropies (at the
        sampling temperature) of the first ``entropy_tokens`` tokens of row k's turn, in the context of ``eps[k]``."""
        if not rows:
            return {}
        device = next(model.parameters()).device
        pad = tokenizer.pad_token_id
        lengths = [min(self.entropy_tokens, int(out.completion_mask[k].sum())) for k in rows]
        ids, mask = _left_pad([eps[k].prompt_ids + eps[k].tokens for k in rows], pad, device)
        width = max(1, max(lengths))
        turn = torch.full((len(rows), width), pad, dtype=torch.long, device=device)
        turn_mask = torch.zeros((len(rows), width), dtype=torch.long, device=device)
        for j, (k, n) in enumerate(zip(rows, lengths)):
            turn[j, :n] = out.completion_ids[k, :n].to(device)
            turn_mask[j, :n] = 1
        was_training = model.training
        model.eval()
        try:
            _, entropy = token_logprobs(
                model, ids, mask, turn, turn_mask, self.engine.temperature, with_entropy=True, share_prompts=False
            )[:2]
        finally:
            model.train(was_training)
        sums = (entropy.float() * turn_mask).sum(-1).tolist()
        return dict(zip(rows, sums))


def _branch_metrics(prompts, G, branched, refills, rises, probs, firsts, shared) -> dict[str, float]:
    n = max(1, prompts)

    def mean(xs) -> float:
        return float(sum(xs) / len(xs)) if xs else 0.0

    return {
        "arpo/branches": branched / n,
        "arpo/branch_frac": branched / max(1, prompts * G),
        "arpo/refills": refills / n,
        "arpo/branch_points": len(rises) / n,
        "arpo/entropy_rise_mean": mean(rises),
        "arpo/branch_prob_mean": mean(probs),
        "arpo/initial_entropy_mean": mean(firsts),
        "arpo/shared_token_frac": float(shared),
    }
