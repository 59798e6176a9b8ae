"""Tree rollouts (issue 23): completions that branch from shared prefixes, one training row per leaf.

A prompt's tree is rooted at the prompt; each node is a span of sampled tokens that continues its parent's. A leaf's
row is the concatenation of the nodes on its path from the root — its ancestors' tokens, copied token for token with
their sampling log-probs, then its own — so the rows of a group share the tokens of their common ancestors, and a
shared token appears in every row below it (how each method weighs those copies is its advantage's business:
``rlexp.algorithms.advantages.tree``). Each row's record carries ``record["episode"]["tree"]`` =
{``leaf`` (its place among the prompt's leaves), ``nodes`` (the ids of the nodes on its path, root excluded; unique
within the prompt), ``ends`` (the completion offset where each of those nodes ends)}: the advantages rebuild the tree
from them. A row's ``truncated`` flag: its leaf did not end with EOS (cut by the depth or the token budget).

Two ways to grow the tree:

* ``SegmentTreeRollout`` — TreePO's segment-wise tree sampling ("TreePO: Bridging the Gap of Policy Optimization and
  Efficacy and Inference Efficiency with Heuristic Tree-based Modeling", Li et al., 2025, arXiv 2508.17445; released
  code multimodal-art-projection/TreePO, ``vllm_rollout_spmd.py``: ``generate_sequences_tree_deepth_first_vanilla_mode``
  with the ``fixed_avg`` divergence, ``by_fixed_div`` budget and ``random`` fallback of ``run_treepo_train.sh``), also
  SPO-tree's fixed-branching segment tree ("Segment Policy Optimization", Guo et al., 2025, arXiv 2505.23564; released
  code AIFrameResearch/SPO, ``hybrid_inference_strategy.py``). Every node decodes one segment of ``segment_tokens``
  tokens. The root gets ``first_branching`` children (a random width in [lo, hi], TreePO's ``random_first_div``) or
  ``branching[0]``. After each round, a node that ended (EOS, the token budget, or depth ``max_depth``) is a leaf; the
  nodes that go on share the prompt's budget of G = ``num_generations`` leaves: with F leaves so far, f of them new this
  round, and A nodes going on, the next round makes D = max(A, min(G − F, Σ_a b(a) + f · max_a b(a))) children
  (b: ``branching`` at the node's depth — TreePO's budget "transferred from the finished trajectories"), split evenly,
  the remainder to the last (``fixed_avg``). So F + A never exceeds G. When a prompt has no node left and fewer than G
  leaves, ``fallback=random`` (TreePO's) restarts from an ancestor of a finished leaf: the leaves that ended with EOS in
  random order (``soft_boxed_and_eos``; none: the root), each cut back to a segment boundary drawn uniformly among its
  blocks, the ancestor ending there getting min(b, G − F) new children; ``fallback=none`` (SPO-tree) leaves the prompt
  with the leaves it has. ``last_segment=rest`` (SPO-tree): the nodes at depth ``max_depth`` decode up to the token
  budget (SPO's last level is not cut).
* ``EntropyTreeRollout`` — TreeRL's EPTree ("TreeRL: LLM Reinforcement Learning with On-Policy Tree Search", Hou et al.,
  2025, arXiv 2506.11902; released code THUDM/TreeRL, ``entropy_chain_local_manager.py``, ``tree_node.py``): ``chains``
  M complete chains per prompt; then ``iterations`` L times, in each of the M chains' trees the ``forks`` N tokens with
  the largest −log π(token) (the code's entropy proxy) among the tree's chains are forking points, each continued
  ``continuations`` T times to the end (the forking token is sampled afresh). A chain's first token after a forking
  point, and a point forked before, are not forked again. The tree's nodes are the chains cut at their forking points
  (TreeRL's steps). M·(1 + L·N·T) leaves; when that exceeds G, G of them are kept at random (the released run trains 16
  of its (6, 2, 1, 2) tree's 30); fewer than G is an error naming the settings. ``chains: null``: the fewest chains
  whose tree has G leaves.

Each node's context (the prompt and the node's prefix, as token ids — sampled tokens are never re-tokenised) is
prefilled afresh for every child (``HFRollout.generate_from_ids``): transformers' generate keeps no cache between
calls, so the shared prefixes save sampled tokens, not prefill (a KV cache shared across branches is a GPU engine's
matter, e.g. vLLM's prefix caching, as the papers use). ``tree/prefill_tokens`` counts what was prefilled.

Greedy calls (evaluation) sample plain completions with the engine. A prompt with fewer leaves than G (SPO-tree's
early-stopped branches, ``fallback=none``) gives a ``SegmentedOutput`` whose ``row_episodes`` maps each row to its
prompt (the trainer's several-rows-per-episode path), so groups may hold fewer than G rows.

Metrics (per prompt unless said): ``tree/leaves``, ``tree/nodes``, ``tree/depth_mean`` (nodes on a leaf's path),
``tree/branching_nodes`` (nodes, the root included, with two children or more), ``tree/shared_token_frac`` (of the
rows' completion tokens, the copies of a node shared with another row), ``tree/sampled_tokens`` (tokens decoded,
dropped leaves included), ``tree/prefill_tokens`` (context tokens prefilled), ``tree/requests`` (decode rows),
``tree/eos_leaf_frac`` (of the rows); segment trees also ``tree/fallbacks`` (children made by the fallback) and
``tree/depth_stop_frac`` (rows cut at ``max_depth``); EPTree ``tree/forks``, ``tree/fork_neglogp_mean`` (−log π at
the forking points) and ``tree/dropped_leaves``."""

from __future__ import annotations

import inspect
import math
import random
from dataclasses import dataclass, field

import torch

from rlexp.rollout.hf import RolloutOutput
from rlexp.rollout.multi_turn import _left_pad
from rlexp.rollout.summarizing import SegmentedOutput

FALLBACKS = ("random", "none")
LAST_SEGMENTS = ("segment", "rest")


@dataclass
class Node:
    """A span of sampled tokens (``tokens``, their ``logprobs``) continuing ``parent`` (None: the prompt)."""

    id: int
    parent: int | None
    depth: int  # nodes from the root (the root's children: 1)
    start: int  # completion offset of the node's first token
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    eos: bool = False  # ended with EOS
    children: list[int] = field(default_factory=list)

    @property
    def end(self) -> int:
        return self.start + len(self.tokens)


class PromptTree:
    """One prompt's tree; node 0 is the root (the prompt itself, no tokens)."""

    def __init__(self, prompt_ids: list[int]):
        self.prompt_ids = list(prompt_ids)
        self.nodes = [Node(0, None, 0, 0)]
        self.leaves: list[int] = []  # finished nodes, in the order they finished
        self.requests = 0  # decode rows this prompt asked for
        self.prefill = 0  # context tokens prefilled for them

    def add(self, parent: int, tokens: list[int], logprobs: list[float], eos: bool) -> Node:
        up = self.nodes[parent]
        node = Node(len(self.nodes), parent, up.depth + 1, up.end, list(tokens), list(logprobs), eos)
        self.nodes.append(node)
        up.children.append(node.id)
        return node

    def path(self, node: int) -> list[int]:
        """The node ids from the root's child down to ``node``."""
        out = []
        while node:
            out.append(node)
            node = self.nodes[node].parent
        return out[::-1]

    def prefix(self, node: int) -> tuple[list[int], list[float]]:
        """The completion tokens (and their sampling log-probs) from the root down to the end of ``node``."""
        toks, lps = [], []
        for n in self.path(node):
            toks += self.nodes[n].tokens
            lps += self.nodes[n].logprobs
        return toks, lps

    def ancestor_ending_at(self, node: int, offset: int) -> int:
        """The deepest node on ``node``'s path (the root included) that ends at or before completion ``offset``."""
        best = 0
        for n in self.path(node):
            if self.nodes[n].end <= offset:
                best = n
        return best


@dataclass
class Leaf:
    """A row of the output: its tokens and log-probs, whether it ended with EOS, its path (node ids, end offsets)."""

    tokens: list[int]
    logprobs: list[float]
    eos: bool
    nodes: list[int]
    ends: list[int]
    depth_stop: bool = False


class _TreeRollout:
    """What both tree rollouts share: the engine, its reads by the trainer, decoding a round of contexts, the output."""

    def __init__(self, engine, max_new_tokens: int | None = None):
        if not hasattr(engine, "generate_from_ids"):
            raise ValueError(f"rollout.engine: {type(engine).__name__} cannot continue token contexts (rollout=hf)")
        if max_new_tokens is not None and max_new_tokens < 1:
            raise ValueError(f"rollout.max_new_tokens must be >= 1 (or null), got {max_new_tokens}")
        self.engine = engine
        self._max_new_tokens = max_new_tokens
        self.rng = random  # draws (widths, fallbacks, kept leaves); the trainer's checkpoints keep Python's RNG state
        self._shadow_kw = "use_shadow" in inspect.signature(engine.generate_from_ids).parameters

    # the trainer's and the evaluation's reads of a rollout
    @property
    def temperature(self) -> float:
        return self.engine.temperature

    @property
    def max_new_tokens(self) -> int:
        return self._max_new_tokens or self.engine.max_new_tokens

    def state_dict(self):
        return self.engine.state_dict() if hasattr(self.engine, "state_dict") else None

    def load_state_dict(self, state) -> None:
        if hasattr(self.engine, "load_state_dict"):
            self.engine.load_state_dict(state)

    def _plain(self, model, tokenizer, prompts, num_generations, greedy, max_new_tokens, **kw) -> RolloutOutput:
        return self.engine.generate(
            model, tokenizer, prompts, num_generations=num_generations, greedy=greedy, max_new_tokens=max_new_tokens
        )

    def _start(self, model, tokenizer, prompts: list[str], max_new_tokens: int | None):
        """A sampled tree rollout's start: the token budget, the device, the sampling model and one empty tree (the
        bookkeeping of requests and prefill) per prompt."""
        budget = min(max_new_tokens or self.max_new_tokens, self.max_new_tokens)
        device = next(model.parameters()).device
        prompt_ids = tokenizer(list(prompts), add_special_tokens=False)["input_ids"]
        return budget, device, self._sampler(model), [PromptTree(ids) for ids in prompt_ids]

    def _sampler(self, model):
        """The model that decodes the tree (the engine's half-precision copy, refreshed once per rollout)."""
        return self.engine.inference_model(model) if hasattr(self.engine, "inference_model") else model

    def _decode(self, model, tokenizer, trees: list[PromptTree], jobs: list[tuple[int, list[int], int]]):
        """One round: job (g, context tokens after the prompt, budget) → (tokens, log-probs, ended with EOS), each row
        cut to its own budget (a row cut short did not end)."""
        if not jobs:
            return []
        device = next(model.parameters()).device
        contexts = [trees[g].prompt_ids + ctx for g, ctx, _ in jobs]
        for (g, _, _), ctx in zip(jobs, contexts):
            trees[g].requests += 1
            trees[g].prefill += len(ctx)
        ids, mask = _left_pad(contexts, tokenizer.pad_token_id, device)
        width = max(n for _, _, n in jobs)
        kw = {"use_shadow": False} if self._shadow_kw else {}
        out = self.engine.generate_from_ids(model, tokenizer, ids, mask, width, **kw)
        results = []
        for k, (_, _, n) in enumerate(jobs):
            length = int(out.completion_mask[k].sum())
            eos = not bool(out.truncated[k]) and length <= n
            length = min(length, n)
            results.append(
                (out.completion_ids[k, :length].tolist(), out.logprobs[k, :length].float().tolist(), eos and length > 0)
            )
        return results

    def _output(self, tokenizer, trees: list[PromptTree], rows: list[list[Leaf]], G: int, device, stats: dict):
        """The rows (prompt-major), their records and the tree metrics."""
        leaves = [leaf for group in rows for leaf in group]
        pad = tokenizer.pad_token_id
        p_ids, p_mask = _left_pad([trees[g].prompt_ids for g, group in enumerate(rows) for _ in group], pad, device)
        width = max(1, max(len(leaf.tokens) for leaf in leaves))
        n = len(leaves)
        ids = torch.full((n, width), pad, dtype=torch.long)
        mask = torch.zeros((n, width), dtype=torch.long)
        logprobs = torch.zeros((n, width), dtype=torch.float32)
        for r, leaf in enumerate(leaves):
            t = len(leaf.tokens)
            ids[r, :t] = torch.tensor(leaf.tokens, dtype=torch.long)
            mask[r, :t] = 1
            logprobs[r, :t] = torch.tensor(leaf.logprobs, dtype=torch.float32)
        texts = tokenizer.batch_decode(ids, skip_special_tokens=True)
        episodes = [
            {"tree": {"leaf": k, "nodes": list(leaf.nodes), "ends": list(leaf.ends)}}
            for group in rows
            for k, leaf in enumerate(group)
        ]
        stats = {**_tree_metrics(trees, rows), **stats}
        fields = (
            p_ids,
            p_mask,
            ids.to(device),
            mask.to(device),
            logprobs.to(device),
            torch.tensor([not leaf.eos for leaf in leaves], device=device),
            texts,
        )
        if all(len(group) == G for group in rows):
            return RolloutOutput(*fields, stats=stats, episodes=episodes)
        row_episodes = [g * G for g, group in enumerate(rows) for _ in group]
        return SegmentedOutput(*fields, stats=stats, episodes=episodes, row_episodes=row_episodes)


class SegmentTreeRollout(_TreeRollout):
    """TreePO's segment-wise tree sampling / SPO-tree's segment tree (module doc): segments of ``segment_tokens``
    tokens (null: ceil(max_new_tokens / max_depth)), ``max_depth`` segments at most, ``branching`` children per node
    (an int, or a list by depth: index d for the children of a node at depth d, the last entry beyond), the root's
    ``first_branching`` ([lo, hi]: a random width; null: the branching), G = ``num_generations`` leaves per prompt
    at most, ``fallback`` random | none, ``last_segment`` segment | rest."""

    def __init__(
        self,
        engine,
        max_new_tokens: int | None = None,
        segment_tokens: int | None = None,
        max_depth: int = 4,
        branching: int | list[int] = 2,
        first_branching: list[int] | None = None,
        fallback: str = "random",
        last_segment: str = "segment",
    ):
        super().__init__(engine, max_new_tokens)
        if max_depth < 1:
            raise ValueError(f"rollout.max_depth must be >= 1, got {max_depth}")
        if segment_tokens is not None and segment_tokens < 1:
            raise ValueError(
                f"rollout.segment_tokens must be >= 1 (or null: max_new_tokens / max_depth), got {segment_tokens}"
            )
        widths = [branching] if isinstance(branching, int) else list(branching)
        if not widths or any(int(b) < 1 for b in widths):
            raise ValueError(f"rollout.branching must be an int >= 1 or a non-empty list of them, got {branching}")
        if first_branching is not None:
            first_branching = [int(x) for x in first_branching]
            if len(first_branching) != 2 or not 1 <= first_branching[0] <= first_branching[1]:
                raise ValueError(
                    f"rollout.first_branching must be [lo, hi] with 1 <= lo <= hi (or null), got {first_branching}"
                )
        if fallback not in FALLBACKS:
            raise ValueError(f"rollout.fallback={fallback!r} is not one of {list(FALLBACKS)}")
        if last_segment not in LAST_SEGMENTS:
            raise ValueError(f"rollout.last_segment={last_segment!r} is not one of {list(LAST_SEGMENTS)}")
        self.max_depth, self.branching, self.first_branching = max_depth, [int(b) for b in widths], first_branching
        self._segment_tokens, self.fallback, self.last_segment = segment_tokens, fallback, last_segment

    def segment_tokens(self, budget: int) -> int:
        return self._segment_tokens or max(1, math.ceil(budget / self.max_depth))

    def width(self, depth: int) -> int:
        """b: the children of a node at ``depth`` (the root: 0)."""
        return self.branching[min(depth, len(self.branching) - 1)]

    def first_width(self, G: int) -> int:
        if self.first_branching is None:
            return min(G, self.width(0))
        lo, hi = self.first_branching
        return self.rng.randint(min(lo, G), min(hi, G))

    @torch.no_grad()
    def generate(
        self,
        model,
        tokenizer,
        prompts: list[str],
        num_generations: int = 1,
        greedy: bool = False,
        max_new_tokens: int | None = None,
        **kw,
    ) -> RolloutOutput:
        """At most G = ``num_generations`` leaves per prompt (exactly G with ``fallback=random``), prompt-major."""
        if greedy:
            return self._plain(model, tokenizer, prompts, num_generations, greedy, max_new_tokens)
        G = num_generations
        budget, device, model, trees = self._start(model, tokenizer, prompts, max_new_tokens)
        seg = self.segment_tokens(budget)
        stops: dict[tuple[int, int], str] = {}  # (g, leaf) -> eos | length | depth
        fallbacks = [0] * len(trees)
        pending = [(g, 0) for g in range(len(trees)) for _ in range(self.first_width(G))]
        sampled = [0] * len(trees)
        while pending:
            jobs = []
            for g, parent in pending:
                node = trees[g].nodes[parent]
                room = budget - node.end
                last = node.depth + 1 >= self.max_depth and self.last_segment == "rest"
                jobs.append((g, trees[g].prefix(parent)[0], room if last else min(seg, room)))
            results = self._decode(model, tokenizer, trees, jobs)
            active: dict[int, list[int]] = {}
            new: dict[int, int] = {}
            for (g, parent), (toks, lps, eos) in zip(pending, results):
                tree = trees[g]
                node = tree.add(parent, toks, lps, eos)
                sampled[g] += len(toks)
                reason = "eos" if eos else "length" if node.end >= budget or not toks else None
                if reason is None and node.depth >= self.max_depth:
                    reason = "depth"
                if reason is None:
                    active.setdefault(g, []).append(node.id)
                else:
                    tree.leaves.append(node.id)
                    stops[(g, node.id)] = reason
                    new[g] = new.get(g, 0) + 1
            pending = []
            for g, tree in enumerate(trees):
                going = active.get(g, [])
                left = G - len(tree.leaves)
                if going:
                    widths = [self.width(tree.nodes[a].depth) for a in going]
                    total = min(max(left, 0), sum(widths) + new.get(g, 0) * max(widths))
                    total = max(total, len(going))
                    each, extra = divmod(total, len(going))
                    for k, a in enumerate(going):
                        pending += [(g, a)] * max(1, each + (extra if k == len(going) - 1 else 0))
                elif left > 0 and self.fallback == "random":
                    made = self._fallback(tree, g, left, seg, stops)
                    pending += made
                    fallbacks[g] += len(made)
        rows = [[self._leaf(tree, leaf, stops[(g, leaf)]) for leaf in tree.leaves] for g, tree in enumerate(trees)]
        n = max(1, len(trees))
        stats = {
            "tree/fallbacks": sum(fallbacks) / n,
            "tree/sampled_tokens": sum(sampled) / n,
            "tree/depth_stop_frac": _mean([leaf.depth_stop for group in rows for leaf in group]),
        }
        return self._output(tokenizer, trees, rows, G, device, stats)

    def _fallback(self, tree: PromptTree, g: int, left: int, seg: int, stops) -> list[tuple[int, int]]:
        """TreePO's ``random`` fallback with ``soft_boxed_and_eos`` leaves: new children of cut-back ancestors."""
        leaves = [leaf for leaf in tree.leaves if stops[(g, leaf)] == "eos"]
        self.rng.shuffle(leaves)
        starts = []
        for leaf in leaves or [0]:
            length = tree.nodes[leaf].end
            if leaf and length >= seg:
                blocks = math.ceil(length / seg)
                keep = (blocks - self.rng.randint(1, blocks)) * seg
                if math.ceil(keep / seg) >= self.max_depth:  # the cut would leave no depth: one segment less
                    keep = seg * (self.max_depth - 1)
                starts.append(tree.ancestor_ending_at(leaf, keep))
            else:
                starts.append(0)
        out = []
        for start in starts:
            if left <= 0:
                break
            k = min(self.width(tree.nodes[start].depth), left)
            out += [(g, start)] * k
            left -= k
        return out

    def _leaf(self, tree: PromptTree, node: int, stop: str) -> Leaf:
        toks, lps = tree.prefix(node)
        path = tree.path(node)
        return Leaf(toks, lps, stop == "eos", path, [tree.nodes[n].end for n in path], depth_stop=stop == "depth")


@dataclass
class Chain:
    """An EPTree chain: ``tokens`` sampled after its parent chain's first ``split`` tokens (``parent`` None: after the
    prompt, ``tree`` its first chain's index)."""

    tree: int
    parent: int | None
    split: int
    offset: int  # completion offset of its first token
    tokens: list[int]
    logprobs: list[float]
    eos: bool
    masked: set[int] = field(default_factory=set)  # positions that cannot fork
    children: list[int] = field(default_factory=list)


class EntropyTreeRollout(_TreeRollout):
    """TreeRL's EPTree (module doc): ``chains`` M (null: the fewest whose tree has G leaves), ``iterations`` L,
    ``forks`` N forking points per chain tree and iteration, ``continuations`` T per forking point."""

    def __init__(
        self,
        engine,
        max_new_tokens: int | None = None,
        chains: int | None = 6,
        forks: int = 2,
        iterations: int = 1,
        continuations: int = 2,
    ):
        super().__init__(engine, max_new_tokens)
        if chains is not None and chains < 1:
            raise ValueError(f"rollout.chains must be >= 1 (or null: enough for the group), got {chains}")
        for key, v in (("forks", forks), ("continuations", continuations)):
            if v < 1:
                raise ValueError(f"rollout.{key} must be >= 1, got {v}")
        if iterations < 0:
            raise ValueError(f"rollout.iterations must be >= 0, got {iterations}")
        self.chains, self.forks, self.iterations, self.continuations = chains, forks, iterations, continuations

    def leaves_per_chain(self) -> int:
        return 1 + self.iterations * self.forks * self.continuations

    def num_chains(self, G: int) -> int:
        per = self.leaves_per_chain()
        M = self.chains if self.chains is not None else math.ceil(G / per)
        if M * per < G:
            raise ValueError(
                f"rollout.chains={M} x (1 + rollout.iterations={self.iterations} x rollout.forks={self.forks} x "
                f"rollout.continuations={self.continuations}) = {M * per} leaves per prompt, fewer than "
                f"trainer.num_generations={G}: raise the tree's settings (or set rollout.chains=null)"
            )
        return M

    @torch.no_grad()
    def generate(
        self,
        model,
        tokenizer,
        prompts: list[str],
        num_generations: int = 1,
        greedy: bool = False,
        max_new_tokens: int | None = None,
        **kw,
    ) -> RolloutOutput:
        """G = ``num_generations`` leaves per prompt (of its M·(1 + L·N·T)), prompt-major."""
        if greedy:
            return self._plain(model, tokenizer, prompts, num_generations, greedy, max_new_tokens)
        G = num_generations
        M = self.num_chains(G)
        budget, device, model, trees = self._start(model, tokenizer, prompts, max_new_tokens)
        chains: list[list[Chain]] = [[] for _ in trees]
        sampled = [0] * len(trees)
        jobs = [(g, [], budget) for g in range(len(trees)) for _ in range(M)]
        for (g, _, _), (toks, lps, eos) in zip(jobs, self._decode(model, tokenizer, trees, jobs)):
            chains[g].append(Chain(len(chains[g]), None, 0, 0, toks, lps, eos))
            sampled[g] += len(toks)
        forks, scores = 0, []
        for _ in range(self.iterations):
            points = []  # (g, chain, position)
            for g, group in enumerate(chains):
                for t in range(M):
                    cands = [
                        (-lp, c, pos)
                        for c, ch in enumerate(group)
                        if ch.tree == t
                        for pos, lp in enumerate(ch.logprobs)
                        if pos not in ch.masked
                    ]
                    cands.sort(key=lambda x: (-x[0], x[1], x[2]))
                    for score, c, pos in cands[: self.forks]:
                        group[c].masked.add(pos)
                        points.append((g, c, pos))
                        scores.append(score)
            if not points:
                break
            forks += len(points)
            jobs = []
            for g, c, pos in points:
                ch = chains[g][c]
                ctx = self._context(chains[g], c) + ch.tokens[:pos]
                jobs += [(g, ctx, budget - len(ctx))] * self.continuations
            results = self._decode(model, tokenizer, trees, jobs)
            for k, (toks, lps, eos) in enumerate(results):
                g, c, pos = points[k // self.continuations]
                parent = chains[g][c]
                child = Chain(parent.tree, c, pos, parent.offset + pos, toks, lps, eos, masked={0})
                parent.children.append(len(chains[g]))
                chains[g].append(child)
                sampled[g] += len(toks)
        rows, dropped = [], 0
        for g, group in enumerate(chains):
            leaves = chain_leaves(group)
            keep = sorted(self.rng.sample(range(len(leaves)), G)) if len(leaves) > G else range(len(leaves))
            dropped += len(leaves) - len(keep)
            rows.append([leaves[i] for i in keep])
        n = max(1, len(trees))
        stats = {
            "tree/sampled_tokens": sum(sampled) / n,
            "tree/forks": forks / n,
            "tree/fork_neglogp_mean": _mean(scores),
            "tree/dropped_leaves": dropped / n,
        }
        return self._output(tokenizer, trees, rows, G, device, stats)

    @staticmethod
    def _context(group: list[Chain], c: int) -> list[int]:
        """The completion tokens before chain ``c``'s first token."""
        ch, out = group[c], []
        while ch.parent is not None:
            up = group[ch.parent]
            out = up.tokens[: ch.split] + out
            ch = up
        return out


def chain_leaves(group: list[Chain]) -> list[Leaf]:
    """One ``Leaf`` per chain of a prompt's EPTree: its context and tokens, and its path through the tree whose nodes
    are the chains cut at their forking points (ids numbered per prompt: TreeRL's steps)."""
    cuts = [sorted({group[k].split for k in ch.children} - {0}) for ch in group]
    ids: dict[tuple[int, int], int] = {}

    def node_id(c: int, start: int) -> int:
        return ids.setdefault((c, start), len(ids) + 1)

    def segments(c: int, upto: int | None) -> list[tuple[int, int]]:
        """(node id, completion end offset) of chain c's segments that end at or before its position ``upto``."""
        ch = group[c]
        bounds = [0, *cuts[c], len(ch.tokens)]
        out = []
        for a, b in zip(bounds, bounds[1:]):
            if upto is not None and b > upto:
                break
            if b > a:
                out.append((node_id(c, a), ch.offset + b))
        return out

    leaves = []
    for c, ch in enumerate(group):
        line = [c]
        while group[line[-1]].parent is not None:
            line.append(group[line[-1]].parent)
        line.reverse()
        path = []
        for a, b in zip(line, line[1:]):
            path += segments(a, group[b].split)
        path += segments(c, None)
        tokens, logprobs = [], []
        for a, b in zip(line, line[1:]):
            tokens += group[a].tokens[: group[b].split]
            logprobs += group[a].logprobs[: group[b].split]
        tokens += ch.tokens
        logprobs += ch.logprobs
        leaves.append(Leaf(tokens, logprobs, ch.eos, [n for n, _ in path], [e for _, e in path]))
    return leaves


def _mean(xs) -> float:
    xs = list(xs)
    return float(sum(xs) / len(xs)) if xs else 0.0


def _tree_metrics(trees: list[PromptTree], rows: list[list[Leaf]]) -> dict[str, float]:
    n = max(1, len(trees))
    leaves = [leaf for group in rows for leaf in group]
    nodes = branching = 0
    copies = 0
    for group in rows:
        children: dict[int, set[int]] = {}
        length: dict[int, int] = {}
        count: dict[int, int] = {}
        for leaf in group:
            prev, start = 0, 0
            for node, end in zip(leaf.nodes, leaf.ends):
                children.setdefault(prev, set()).add(node)
                length[node] = end - start
                count[node] = count.get(node, 0) + 1
                prev, start = node, end
        nodes += len(length)
        branching += sum(len(c) >= 2 for c in children.values())
        copies += sum(length[k] * (count[k] - 1) for k in length)
    tokens = sum(len(leaf.tokens) for leaf in leaves)
    return {
        "tree/leaves": len(leaves) / n,
        "tree/nodes": nodes / n,
        "tree/depth_mean": _mean(len(leaf.nodes) for leaf in leaves),
        "tree/branching_nodes": branching / n,
        "tree/shared_token_frac": copies / tokens if tokens else 0.0,
        "tree/prefill_tokens": sum(t.prefill for t in trees) / n,
        "tree/requests": sum(t.requests for t in trees) / n,
        "tree/eos_leaf_frac": _mean(leaf.eos for leaf in leaves),
    }
