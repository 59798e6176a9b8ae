"""RLCCF's collective vote ("Wisdom of the Crowd: Reinforcement Learning from Coevolutionary Collective Feedback",
Yuan et al., 2025; arXiv 2508.12338), as a group stage.

What the paper states (its abstract and introduction; the method section and any released code were not reachable
from here): a collective of diverse LLMs is trained together, label-free, to maximise its Collective Consistency
(CC); the reward comes from a vote over the collective's outputs in which each model's vote is weighted by its
Self-Consistency (SC) score, so that more confident models count more.

Here — rlexp trains one policy per run — the collective is the policy plus frozen *peer* models (``peers``: model
configs, e.g. ``${model}``, the run's own model at its loaded weights, or ``conf/model`` entries such as
``smollm2_135m``). For each group (one prompt) every peer samples ``samples_per_peer`` completions of the group's
prompt with the run's rollout engine; all answers of the prompt (the policy's G and the peers') are extracted in the
prompt's answer format and clustered by math-equivalence (``votes.cluster_answers``). Then, our reading of the
abstract where the formulas are not published:

* SC of a member = the share of its samples whose answer is its own most frequent answer (a sample without an answer
  counts in the denominator and never in the majority; a member with no answer has SC 0);
* the collective label = argmax over answers a of  Σ_members SC_m · (share of member m's samples answering a)  —
  each member's vote is its answer distribution (so the policy's G and a peer's n samples weigh alike) scaled by its
  SC; a tie goes to the answer seen first (the policy's rows first, then the peers in order); no answer from anyone:
  no label;
* the reward of a policy completion = 1 when its answer equals the label, else 0 (no label, no answer: 0);
* CC of a prompt = the share of all the members' samples whose answer is the label.

Peer samples are drawn from a generator seeded by (``seed``, step, peer index): a run repeats them, a resume too; they
are cached for the current step only (nothing is checkpointed). The reward is appended as reward column ``name``
(weight 1). ``label_term``: a reward term that reads the ground truth and must stay at weight 0 (use
``reward=label_free``)."""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import torch

from rlexp.algorithms.group_stages.base import append_reward_column, refuse_trained_label
from rlexp.algorithms.group_stages.votes import cluster_answers
from rlexp.core.batch import RolloutBatch
from rlexp.core.registry import GROUP_STAGES
from rlexp.rewards.answers import extract_answer
from rlexp.rewards.terms import check_answer

log = logging.getLogger(__name__)

_KEY = "algorithm.group_stages: CollectiveVote"


def self_consistency(ids: list[int]) -> float:
    """SC of one member's samples (cluster ids, −1: no answer): the share of them in its most frequent cluster; 0
    without samples or answers."""
    counts: dict[int, int] = {}
    for j in ids:
        if j >= 0:
            counts[j] = counts.get(j, 0) + 1
    return max(counts.values()) / len(ids) if counts else 0.0


@dataclass
class CollectiveResult:
    """One prompt's collective vote: the label (an answer text; None without any answer), its cluster, each
    member's SC and cluster ids, the vote of each cluster, the policy's rewards and the collective consistency."""

    label: str | None
    label_cluster: int | None
    sc: list[float]
    member_ids: list[list[int]]
    votes: dict[int, float]
    rewards: list[float]
    consistency: float


def collective_vote(member_answers: list[list[str | None]], tol: float = 1e-9) -> CollectiveResult:
    """The SC-weighted vote of one prompt's members (member 0: the policy, whose samples are rewarded; see the module
    docstring). ``tol``: vote totals closer than this count as a tie (the first-seen answer wins)."""
    flat = [a for answers in member_answers for a in answers]
    ids = cluster_answers(flat)
    member_ids, k = [], 0
    for answers in member_answers:
        member_ids.append(ids[k : k + len(answers)])
        k += len(answers)
    sc = [self_consistency(m) for m in member_ids]
    votes: dict[int, float] = {}
    for m, w in zip(member_ids, sc):
        for j in m:
            if j >= 0:
                votes[j] = votes.get(j, 0.0) + w / len(m)
    label_cluster = None
    if votes:
        best = max(votes.values())
        label_cluster = min(j for j, v in votes.items() if v >= best - tol)  # cluster ids are in first-seen order
    label = None if label_cluster is None else flat[ids.index(label_cluster)]
    rewards = [float(label_cluster is not None and j == label_cluster) for j in member_ids[0]] if member_ids else []
    hits = sum(j == label_cluster for j in ids) if label_cluster is not None else 0
    return CollectiveResult(label, label_cluster, sc, member_ids, votes, rewards, hits / len(flat) if flat else 0.0)


def peer_seed(seed: int, step: int, peer: int) -> int:
    """The seed of peer ``peer``'s samples at step ``step`` (a stream apart from the rollout's and the split's)."""
    return ((int(seed) * 1_000_003 + int(step)) * 7_919 + 104_729 + 15_485_863 * (int(peer) + 1)) % (2**63 - 1)


def peer_model_config(spec, key: str) -> dict:
    """A peer's ``model/`` config: a mapping (``${model}``, or any model entry written out), the name of a
    ``conf/model`` entry (``tiny``, ``smollm2_135m``) or a local ``from_pretrained`` directory. ``peft`` is dropped: a
    peer is the plain frozen model."""
    from omegaconf import DictConfig, OmegaConf

    if isinstance(spec, DictConfig):
        spec = OmegaConf.to_container(spec, resolve=True)
    if isinstance(spec, str):
        from rlexp.config.paths import CONF_DIR

        entry = Path(CONF_DIR) / "model" / f"{spec}.yaml"
        if entry.is_file():
            cfg = OmegaConf.to_container(OmegaConf.load(entry), resolve=True)
        elif Path(spec).is_dir():
            cfg = {"source": "hub", "name": Path(spec).name, "path": spec, "dtype": "auto"}
        else:
            raise ValueError(
                f"{key}={spec!r} is neither a model config under conf/model nor a local model directory "
                "(a peer is a model config: ${model}, a conf/model name such as smollm2_135m, or a directory)"
            )
    elif isinstance(spec, Mapping):
        cfg = dict(spec)
    else:
        raise ValueError(f"{key}={spec!r}: a peer is a model config mapping, a conf/model name or a directory")
    if "source" not in cfg:
        raise ValueError(f"{key}: the model config {sorted(cfg)} has no `source` (gguf_package, tiny or hub)")
    cfg.pop("peft", None)
    return cfg


@GROUP_STAGES.register
class CollectiveVote:
    """Group stage: RLCCF's SC-weighted collective vote over the policy and frozen peers as the reward (see the
    module docstring).

    ``peers``: the frozen members (model configs, loaded once on the policy's device at the first step);
    ``samples_per_peer``: completions each peer samples per prompt (null: the policy's group size);
    ``max_new_tokens``: the peers' completion length (null: the rollout's); ``seed``: the peers' sampling seed
    (``${trainer.seed}``).

    Logged: ``rlccf/policy_sc_mean`` and ``rlccf/peer_sc_mean`` (the vote weights), ``rlccf/collective_consistency``
    (share of all members' samples answering the label), ``rlccf/policy_label_agreement`` (prompts, among those with a
    label, whose label is the policy's own majority answer: below 1 where the peers overrule it),
    ``rlccf/no_label_frac`` (prompts no member answered), ``rlccf/label_accuracy`` (the label against the hidden
    record label, for the log only, never trained on)."""

    needs_reference = False

    def __init__(
        self,
        peers: list | None = None,
        samples_per_peer: int | None = None,
        name: str = "rlccf",
        fallback_last_number: bool = True,
        label_term: str | None = "accuracy",
        max_new_tokens: int | None = None,
        seed: int = 0,
    ):
        if not peers:
            raise ValueError(
                f"{_KEY}.peers is empty: RLCCF votes over a collective — give the frozen peer models, e.g. "
                "peers=[${model}] (the run's model at its loaded weights) or peers=[smollm2_135m]"
            )
        if samples_per_peer is not None and samples_per_peer < 1:
            raise ValueError(f"{_KEY}.samples_per_peer={samples_per_peer} must be >= 1 (or null: the group size)")
        if max_new_tokens is not None and max_new_tokens < 1:
            raise ValueError(f"{_KEY}.max_new_tokens={max_new_tokens} must be >= 1 (or null: the rollout's)")
        self.peer_configs = [peer_model_config(p, f"{_KEY}.peers[{i}]") for i, p in enumerate(peers)]
        self.samples_per_peer, self.name, self.fallback = samples_per_peer, name, fallback_last_number
        self.label_term, self.max_new_tokens, self.seed = label_term, max_new_tokens, int(seed)
        self._models: list | None = None  # (model, tokenizer) per peer, loaded at the first call
        self._cache: dict[tuple[int, int, str], list[str]] = {}  # (step, peer, prompt) -> texts; this step only
        self._warned = False

    def peer_models(self, ctx) -> list:
        """The peers as (model, tokenizer), frozen, on the policy's device (loaded once)."""
        if self._models is None:
            from omegaconf import OmegaConf

            from rlexp.models.loading import load_model

            device = next(ctx.policy.parameters()).device
            self._models = []
            for cfg in self.peer_configs:
                loaded = load_model(OmegaConf.create(cfg), device)
                loaded.model.eval().requires_grad_(False)
                self._models.append((loaded.model, loaded.tokenizer))
        return self._models

    def sample_peers(self, prompts: list[str], n: int, ctx) -> list[dict[str, list[str]]]:
        """Each peer's ``n`` completion texts of each prompt (drawn once per step; deterministic in the seed and
        the step)."""
        rollout = ctx.rollout
        if rollout is None or not hasattr(rollout, "generation_copy"):
            raise RuntimeError(
                f"{_KEY} samples its peers with the Hugging Face rollout engine (rollout=hf); "
                f"got {type(rollout).__name__}"
            )
        self._cache = {key: v for key, v in self._cache.items() if key[0] == ctx.step}  # per step only
        device = next(ctx.policy.parameters()).device
        dtype = getattr(ctx, "autocast_dtype", None)
        unique = list(dict.fromkeys(prompts))
        out: list[dict[str, list[str]]] = []
        for k, (model, tok) in enumerate(self.peer_models(ctx)):
            own_template = getattr(ctx.tokenizer, "chat_template", None)
            if not self._warned and getattr(tok, "chat_template", None) != own_template:
                log.warning(
                    "%s.peers[%d] has another chat template than the policy: it is given the policy's rendered prompts",
                    _KEY,
                    k,
                )
                self._warned = True
            todo = [p for p in unique if (ctx.step, k, p) not in self._cache]
            if todo:
                # the peers draw from their own seed; the training RNG is restored after (fork_rng)
                devices = [device] if device.type == "cuda" else []
                with (
                    torch.random.fork_rng(devices=devices),
                    torch.autocast(device.type, dtype=dtype or torch.bfloat16, enabled=dtype is not None),
                ):
                    torch.manual_seed(peer_seed(self.seed, ctx.step, k))
                    res = rollout.generate(
                        model, tok, todo, num_generations=n, max_new_tokens=self.max_new_tokens, use_shadow=False
                    )
                for i, p in enumerate(todo):
                    self._cache[(ctx.step, k, p)] = list(res.texts[i * n : (i + 1) * n])
            out.append({p: self._cache[(ctx.step, k, p)] for p in unique})
        return out

    def __call__(self, batch: RolloutBatch, ctx) -> RolloutBatch:
        refuse_trained_label(batch, self.label_term, "CollectiveVote (RLCCF)")
        fmt = getattr(ctx, "answer_format", "hash")
        answers = [extract_answer(c, fmt, fallback_last_number=self.fallback) for c in batch.completions]
        groups: dict[int, list[int]] = {}
        for i, g in enumerate(batch.group_ids.tolist()):
            groups.setdefault(g, []).append(i)
        n = self.samples_per_peer or max(len(rows) for rows in groups.values())
        prompts = {g: batch.prompts[rows[0]] for g, rows in groups.items()}  # a group's prompt: its first row's
        peer_texts = self.sample_peers(list(prompts.values()), n, ctx)
        scores = torch.zeros(len(batch))
        policy_sc, peer_sc, consistency, agree, correct, no_label = [], [], [], [], [], 0
        for g, rows in groups.items():
            members = [[answers[i] for i in rows]]
            for texts in peer_texts:
                members.append([extract_answer(t, fmt, fallback_last_number=self.fallback) for t in texts[prompts[g]]])
            res = collective_vote(members)
            for i, r in zip(rows, res.rewards):
                scores[i] = r
            policy_sc.append(res.sc[0])
            peer_sc.extend(res.sc[1:])
            consistency.append(res.consistency)
            if res.label is None:
                no_label += 1
                continue
            own = res.member_ids[0]
            own_counts = {j: own.count(j) for j in own if j >= 0}
            own_top = min(own_counts, key=lambda j: (-own_counts[j], j)) if own_counts else None
            agree.append(float(own_top == res.label_cluster))
            record = batch.records[rows[0]]
            if record.get("answer") is not None:
                with contextlib.suppress(KeyError, ValueError):  # a label its scorer cannot check: not logged
                    correct.append(check_answer(res.label, record))
        append_reward_column(batch, self.name, scores)
        s = batch.stats
        s["rlccf/policy_sc_mean"] = _mean(policy_sc)
        s["rlccf/peer_sc_mean"] = _mean(peer_sc)
        s["rlccf/collective_consistency"] = _mean(consistency)
        s["rlccf/policy_label_agreement"] = _mean(agree)
        s["rlccf/no_label_frac"] = no_label / max(len(groups), 1)
        s["rlccf/label_accuracy"] = _mean(correct)
        return batch


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else math.nan
