"""Rewards computed by a sequence-classification reward model (issue 23): any ``AutoModelForSequenceClassification``
checkpoint (a hub id or a local directory) scores each (question, completion) pair, as one weighted, logged and
sweepable reward term beside the rule terms.

``RewardModel`` loads the model and its own tokenizer lazily at the first call (on ``device``, in ``dtype``, frozen:
``eval()`` and ``requires_grad_(False)``, scored under ``no_grad``), renders each pair with the reward model's own chat
template (``[user: question, assistant: completion]``; ``chat_template: false`` encodes the pair as a text pair, as
encoder reward models such as OpenAssistant's DeBERTa expect), scores batches of ``batch_size`` (right padding; the
model reads the last non-pad token; inputs longer than ``max_length`` lose their start) and keeps the scores in an
in-memory LRU cache keyed by a hash of (question, completion): a completion scored before is not scored again.

Several reward models (``models: [...]``) are combined (``combine``): ``mean`` of their scores (the ensemble mean),
``min`` (the worst case: Coste et al., "Reward Model Ensembles Help Mitigate Overoptimization", 2023, arXiv
2310.02743), or ``weight_average``: one model whose weights are the uniform mean of theirs (WARM, "WARM: On the
Benefits of Weight Averaged Reward Models", Ramé et al., 2024, arXiv 2401.12187: reward models fine-tuned from one
pre-trained initialisation, same architecture; the fine-tuning of the M models is not ours to do). ``normalise``:
``none`` (the raw logit), ``sigmoid`` (into (0, 1)) or ``softmax`` (P(``label``) for a classifier with several
labels).

No reward model ships offline: the term needs its ``model`` set (a config error otherwise). Metrics, as
``reward/<term>/<key>``: ``cache_hits`` (this step's pairs found in the cache), ``cache_hit_rate``, ``truncated``
(pairs cut at ``max_length``), ``ensemble_std`` (mean spread of the scores across models, with several).
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections import OrderedDict
from collections.abc import Sequence

import torch

from rlexp.core.registry import REWARDS
from rlexp.rewards.terms import RewardTerm, Sample, TermResult

log = logging.getLogger(__name__)

NORMALISE = ("none", "sigmoid", "softmax")
COMBINE = ("mean", "min", "weight_average")
DTYPES = ("auto", "float32", "bfloat16", "float16")


def pair_key(*parts: str) -> str:
    """A short stable hash of the texts (the cache key of a pair)."""
    return hashlib.sha1(json.dumps(parts, ensure_ascii=False).encode()).hexdigest()


class LRUCache:
    """An in-memory least-recently-used cache of ``size`` entries (0: off) that counts its hits and misses."""

    MISS = object()

    def __init__(self, size: int):
        if size < 0:
            raise ValueError(f"cache={size}: must be >= 0 (0: no cache)")
        self.size, self.hits, self.misses = int(size), 0, 0
        self._d: OrderedDict = OrderedDict()

    def get(self, key):
        if key in self._d:
            self._d.move_to_end(key)
            self.hits += 1
            return self._d[key]
        self.misses += 1
        return self.MISS

    def put(self, key, value) -> None:
        if self.size == 0:
            return
        self._d[key] = value
        self._d.move_to_end(key)
        while len(self._d) > self.size:
            self._d.popitem(last=False)

    def clear(self) -> None:
        self._d.clear()

    def __len__(self) -> int:
        return len(self._d)


def model_source(spec) -> tuple[str, str | None]:
    """(path or hub id, revision) of a ``model`` setting: a string, or a ``model/`` config node of ``source: hub``."""
    if isinstance(spec, str):
        return spec, None
    try:
        node = dict(spec)
    except (TypeError, ValueError):
        raise ValueError(f"RewardModel.model={spec!r}: a hub id, a local path or a model config with a path") from None
    if node.get("source", "hub") != "hub" or not node.get("path"):
        raise ValueError(
            f"RewardModel.model: a model config must be source: hub with a path (a sequence-classification "
            f"checkpoint), got source={node.get('source')!r}"
        )
    return str(node["path"]), node.get("revision")


def resolve_device(device: str) -> torch.device:
    return torch.device(("cuda" if torch.cuda.is_available() else "cpu") if device == "auto" else device)


def resolve_rm_dtype(dtype: str, device: torch.device) -> torch.dtype:
    """``auto``: bfloat16 on a GPU, float32 on the CPU."""
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]


_LOADED: dict[str, tuple] = {}


def load_reward_model(path: str, device: torch.device, dtype: torch.dtype, revision: str | None = None):
    """The frozen sequence-classification model and its tokenizer (a pad token set: the eos, when it has none),
    loaded once per (path, revision, device, dtype) and kept for the process."""
    key = json.dumps([path, revision, str(device), str(dtype)])
    if key not in _LOADED:
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        kwargs = {"revision": revision} if revision else {}
        tok = AutoTokenizer.from_pretrained(path, **kwargs)
        if tok.pad_token is None:
            tok.pad_token = tok.eos_token
        model = AutoModelForSequenceClassification.from_pretrained(path, dtype=dtype, **kwargs)
        if model.config.pad_token_id is None:  # batches of more than one row need it (the last non-pad token)
            model.config.pad_token_id = tok.pad_token_id
        model.to(device).eval().requires_grad_(False)
        _LOADED[key] = (model, tok)
    return _LOADED[key]


def average_weights(models: Sequence) -> torch.nn.Module:
    """WARM's weight average: the first model with every floating-point tensor replaced by the mean over
    ``models`` (same architecture: same tensor names and shapes, else a ValueError). Changes the first in place."""
    states = [m.state_dict() for m in models]
    base = states[0]
    for i, s in enumerate(states[1:], 1):
        if s.keys() != base.keys() or any(s[k].shape != base[k].shape for k in base):
            raise ValueError(f"RewardModel.combine=weight_average: model {i} does not have model 0's architecture")
    with torch.no_grad():
        for k, v in base.items():
            if v.is_floating_point():
                v.copy_((sum(s[k].float() for s in states) / len(states)).to(v.dtype))
    return models[0]


def render_pairs(tokenizer, questions: Sequence[str], completions: Sequence[str], chat_template: bool):
    """The reward model's inputs: each pair as its chat (user: question, assistant: completion), or the text pairs."""
    if not chat_template:
        return list(questions), list(completions)
    texts = [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": q}, {"role": "assistant", "content": c}], tokenize=False
        )
        for q, c in zip(questions, completions)
    ]
    return texts, None


@torch.no_grad()
def reward_model_logits(
    model,
    tokenizer,
    questions: Sequence[str],
    completions: Sequence[str],
    chat_template: bool = True,
    max_length: int = 2048,
    batch_size: int = 8,
) -> tuple[torch.Tensor, int]:
    """(N, num_labels) float32 logits of the reward model for each pair, and how many pairs were cut at
    ``max_length``. Right padding, so each row's positions are those of the row scored alone."""
    first, second = render_pairs(tokenizer, questions, completions, chat_template)
    device = next(model.parameters()).device
    out, cut = [], 0
    side, trunc = tokenizer.padding_side, getattr(tokenizer, "truncation_side", "right")
    tokenizer.padding_side = "right"
    if second is None:
        tokenizer.truncation_side = "left"  # keep the end of the completion: the model reads the last token
    try:
        for k in range(0, len(first), batch_size):
            args = [first[k : k + batch_size]] + ([second[k : k + batch_size]] if second is not None else [])
            full = tokenizer(*args, add_special_tokens=second is not None)["input_ids"]
            cut += sum(len(ids) > max_length for ids in full)
            enc = tokenizer(
                *args,
                return_tensors="pt",
                padding=True,
                truncation=True,
                max_length=max_length,
                add_special_tokens=second is not None,  # a chat template writes its own special tokens
            ).to(device)
            out.append(model(**enc).logits.float().cpu())
    finally:
        tokenizer.padding_side = side
        tokenizer.truncation_side = trunc
    return (torch.cat(out) if out else torch.empty(0, 1)), cut


@REWARDS.register
class RewardModel(RewardTerm):
    """A sequence-classification reward model's score of (question, completion) (module doc): ``model`` a hub id,
    a local path or a ``model/`` config of ``source: hub``; ``models`` several, combined by ``combine``."""

    def __init__(
        self,
        weight: float = 1.0,
        model=None,
        models: Sequence | None = None,
        combine: str = "mean",
        device: str = "auto",
        dtype: str = "auto",
        batch_size: int = 8,
        max_length: int = 2048,
        chat_template: bool = True,
        normalise: str = "none",
        label: int = 0,
        cache: int = 4096,
        question_key: str = "question",
        revision: str | None = None,
    ):
        super().__init__(weight)
        if model is not None and models:
            raise ValueError("RewardModel: set model or models, not both")
        specs = [model] if model is not None else list(models or [])
        if not specs:
            raise ValueError(
                "RewardModel.model is not set: no reward model ships offline; give the term's model "
                "(reward.terms.<term>.model=<hub id or local path>, e.g. Skywork/Skywork-Reward-V2-Qwen3-0.6B)"
            )
        self.sources = [model_source(s) for s in specs]
        if revision is not None:
            self.sources = [(p, r or revision) for p, r in self.sources]
        if combine not in COMBINE:
            raise ValueError(f"RewardModel.combine={combine!r}: must be one of {COMBINE}")
        if normalise not in NORMALISE:
            raise ValueError(f"RewardModel.normalise={normalise!r}: must be one of {NORMALISE}")
        if dtype not in DTYPES:
            raise ValueError(f"RewardModel.dtype={dtype!r}: must be one of {DTYPES}")
        if batch_size < 1 or max_length < 2:
            raise ValueError(f"RewardModel: batch_size ({batch_size}) must be >= 1, max_length ({max_length}) >= 2")
        self.combine, self.normalise, self.label = combine, normalise, int(label)
        self.device_name, self.dtype_name = device, dtype
        self.batch_size, self.max_length, self.chat_template = int(batch_size), int(max_length), bool(chat_template)
        self.question_key = question_key
        self.cache = LRUCache(cache)
        self._scorers: list[tuple] | None = None  # [(model, tokenizer)], loaded at the first call

    def scorers(self) -> list[tuple]:
        """The loaded (model, tokenizer) pairs (one after a weight average)."""
        if self._scorers is None:
            device = resolve_device(self.device_name)
            dtype = resolve_rm_dtype(self.dtype_name, device)
            loaded = [load_reward_model(p, device, dtype, r) for p, r in self.sources]
            for (m, t), (p, _) in zip(loaded, self.sources):
                if self.chat_template and not getattr(t, "chat_template", None):
                    raise ValueError(
                        f"RewardModel.chat_template=true but the tokenizer of {p!r} has no chat template: set "
                        "chat_template: false (the (question, completion) text pair)"
                    )
                if not 0 <= self.label < m.config.num_labels:
                    raise ValueError(f"RewardModel.label={self.label}: {p!r} has {m.config.num_labels} labels")
            if self.combine == "weight_average" and len(loaded) > 1:
                import copy

                first = copy.deepcopy(loaded[0][0])  # the cached models stay as loaded
                loaded = [(average_weights([first, *(m for m, _ in loaded[1:])]), loaded[0][1])]
            self._scorers = loaded
        return self._scorers

    def question_of(self, s: Sample) -> str:
        return str(s.record.get(self.question_key, s.prompt)) if s.record else s.prompt

    def to_score(self, logits: torch.Tensor) -> torch.Tensor:
        if self.normalise == "softmax":
            return torch.softmax(logits, -1)[:, self.label]
        x = logits[:, self.label]
        return torch.sigmoid(x) if self.normalise == "sigmoid" else x

    def score_pairs(self, questions: Sequence[str], completions: Sequence[str]) -> tuple[list[float], dict]:
        """The combined scores of the pairs (no cache) and the term's metrics of this pass."""
        per, cut = [], 0
        for model, tok in self.scorers():
            logits, c = reward_model_logits(
                model, tok, questions, completions, self.chat_template, self.max_length, self.batch_size
            )
            per.append(self.to_score(logits))
            cut = max(cut, c)
        stacked = torch.stack(per)  # (models, N)
        combined = stacked.min(0).values if self.combine == "min" else stacked.mean(0)
        metrics = {"truncated": float(cut)}
        if len(per) > 1:
            metrics["ensemble_std"] = float(stacked.std(0).mean())
        return combined.tolist(), metrics

    def score(self, sample: Sample) -> float:
        return self([sample]).scores[0]

    def __call__(self, samples: list[Sample]) -> TermResult:
        if not samples:
            return TermResult([], [])
        questions = [self.question_of(s) for s in samples]
        keys = [pair_key(q, s.completion) for q, s in zip(questions, samples)]
        scores: list = [self.cache.get(k) for k in keys]
        hits = sum(v is not LRUCache.MISS for v in scores)
        todo = [i for i, v in enumerate(scores) if v is LRUCache.MISS]
        failures = [False] * len(samples)
        metrics: dict[str, float] = {}
        if todo:
            self.scorers()  # a model that cannot load is a configuration error: raise
            try:
                new, metrics = self.score_pairs([questions[i] for i in todo], [samples[i].completion for i in todo])
            except Exception as e:  # the forward failed on the batch (out of memory, a bad input): recorded, not fatal
                log.warning("reward RewardModel failed on a batch of %d: %r", len(todo), e)
                new = [None] * len(todo)
            for i, v in zip(todo, new):
                scores[i] = v
                if v is None:
                    failures[i] = True
                else:
                    self.cache.put(keys[i], v)
        metrics.update({"cache_hits": float(hits), "cache_hit_rate": hits / len(samples)})
        return TermResult([0.0 if v is None else float(v) for v in scores], failures, metrics=metrics)
