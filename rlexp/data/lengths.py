"""Prompt lengths against the model's context: ``trainer.max_prompt_length`` (tokens, chat template included; null:
the model's context minus ``trainer.max_new_tokens``, which is also the most it may be) and
``trainer.overlong_prompts`` (``error`` | ``truncate`` | ``drop``). TRL calls the limit ``max_prompt_length`` and
verl refuses overlong prompts by default (``truncation: error``); so does rlexp.

At its first step the trainer measures every prompt of the training and held-out splits (``PromptLimit.prepare``),
before anything is generated: each question is rendered with the chat template (microseconds) and only the
prompts whose UTF-8 size is near or over the limit are tokenised (a token is at least one byte), in one batch, so
a 100k-token question costs one tokenizer call and no memory beyond its ids. Then

* ``error``: the first prompt over the limit is a one-line ``ConfigError`` naming its row (file and row, or the
  dataset and record id), its length and the limit;
* ``drop``: a training prompt over the limit is skipped when the sampler draws it, and the step draws the next
  prompt in its place (``PromptLimit.select``), so every step still has ``trainer.prompts_per_step`` prompts;
  held-out prompts over the limit are truncated (the greedy evaluation cannot leave a row out);
* ``truncate``: the prompt is rendered with the question's first tokens cut so that it fits (TRL truncates prompts
  on the left too; here the system prompt, the instruction and the generation prompt stay whole).

The limit is attached to the ``PromptFormat`` (``PromptFormat.limit``), so every prompt rendered with it during the
run — the training batch, the greedy evaluation — fits or is refused, never generated past the context.
"""

from __future__ import annotations

import logging
import weakref
from dataclasses import dataclass, field

log = logging.getLogger(__name__)

POLICIES = ("error", "truncate", "drop")
_BYTE_MARGIN = 16  # template and joining tokens a byte count cannot see: prompts this close to the limit are counted


def model_context(model) -> int | None:
    """The model's context length in tokens (``max_position_embeddings`` and its aliases), or None if unknown."""
    config = getattr(model, "config", None)
    if config is not None and hasattr(config, "get_text_config"):
        config = config.get_text_config()
    for key in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
        value = getattr(config, key, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def where(record: dict) -> str:
    """A record's row, as the user can find it: ``dataset.path=<file> row <n> (record '<id>')`` for a file
    (``cell_text`` keeps them in the metadata), else the record id."""
    meta = record.get("metadata") or {}
    if isinstance(meta, dict) and meta.get("source") and meta.get("row"):
        return f"{meta['source']} row {meta['row']} (record {record.get('id')!r})"
    return f"record {record.get('id')!r}"


@dataclass
class PromptLimit:
    limit: int  # tokens a rendered prompt may have
    policy: str = "error"
    why: str = ""  # how the limit was set (for messages)
    _overlong: set = field(default_factory=set, repr=False)  # id() of the training records over the limit
    _known: set = field(default_factory=set, repr=False)  # id() of the records measured by prepare
    _warned: bool = field(default=False, repr=False)

    @classmethod
    def for_run(
        cls, max_prompt_length: int | None, policy: str, context: int | None, max_new_tokens: int
    ) -> PromptLimit | None:
        """The run's limit, or None when neither the setting nor the model's context gives one."""
        from rlexp.config.schema import ConfigError

        if policy not in POLICIES:
            raise ConfigError(f"trainer.overlong_prompts={policy!r} must be one of {list(POLICIES)}")
        room = context - max_new_tokens if context else None
        if room is not None and room < 1:
            raise ConfigError(
                f"trainer.max_new_tokens={max_new_tokens} leaves no room for a prompt in the model's context of "
                f"{context} tokens"
            )
        if max_prompt_length is None:
            if room is None:
                return None
            why = (
                f"trainer.max_prompt_length=null: the model's context of {context} tokens minus "
                f"trainer.max_new_tokens={max_new_tokens}"
            )
            return cls(room, policy, why)
        if room is not None and max_prompt_length > room:
            raise ConfigError(
                f"trainer.max_prompt_length={max_prompt_length} does not fit the model's context of {context} tokens "
                f"with trainer.max_new_tokens={max_new_tokens}: at most {room}"
            )
        return cls(int(max_prompt_length), policy, f"trainer.max_prompt_length={max_prompt_length}")

    def describe(self) -> str:
        return f"the limit of {self.limit} tokens ({self.why})" if self.why else f"the limit of {self.limit} tokens"

    # ---- measuring --------------------------------------------------------------------------------------
    def lengths(self, tokenizer, fmt, questions: list[str]) -> list[int]:
        """Token lengths of the rendered prompts; a prompt whose UTF-8 size is well under the limit is reported
        as that size (an upper bound: it fits) without being tokenised."""
        rendered = [fmt.render_full(tokenizer, q) for q in questions]
        sizes = [len(p.encode("utf-8")) for p in rendered]
        near = [i for i, n in enumerate(sizes) if n > self.limit - _BYTE_MARGIN]
        if near:
            ids = tokenizer([rendered[i] for i in near], add_special_tokens=False)["input_ids"]
            for i, row in zip(near, ids):
                sizes[i] = len(row)
        return sizes

    def prepare(self, tokenizer, fmt, train: list[dict], held_out: list[dict], prompts_per_step: int) -> None:
        """Measure both splits before the first rollout and apply the policy (see the module docstring)."""
        from rlexp.config.schema import ConfigError

        over = []
        for split, records in (("training", train), ("held-out", held_out)):
            lengths = self.lengths(tokenizer, fmt, [r["question"] for r in records])
            bad = [(r, n) for r, n in zip(records, lengths) if n > self.limit]
            self._known.update(id(r) for r in records)
            if bad and self.policy == "error":
                r, n = bad[0]
                raise ConfigError(
                    f"{where(r)}: the {split} prompt is {n} tokens, more than {self.describe()} "
                    f"({len(bad)} of {len(records)} {split} prompts are over it); set trainer.overlong_prompts=drop to "
                    "leave them out or truncate to cut their question"
                )
            over.append(bad)
        train_over, eval_over = over
        if self.policy == "drop":
            self._overlong = {id(r) for r, _ in train_over}
            fitting = len(train) - len(train_over)
            if fitting < prompts_per_step:
                raise ConfigError(
                    f"trainer.prompts_per_step={prompts_per_step} is more than the {fitting} training prompts within "
                    f"{self.describe()} ({len(train_over)} of {len(train)} dropped by trainer.overlong_prompts=drop)"
                )
        if train_over:
            r, n = train_over[0]
            log.warning(
                "%d of %d training prompts are longer than %s (the first: %s, %d tokens): %s",
                len(train_over),
                len(train),
                self.describe(),
                where(r),
                n,
                "skipped when drawn" if self.policy == "drop" else "the start of their question is cut",
            )
        if eval_over:
            log.warning(
                "%d of %d held-out prompts are longer than %s: the start of their question is cut",
                len(eval_over),
                len(held_out),
                self.describe(),
            )

    # ---- applying -----------------------------------------------------------------------------------------
    def is_overlong(self, tokenizer, fmt, record: dict) -> bool:
        if id(record) in self._known:
            return id(record) in self._overlong
        return self.lengths(tokenizer, fmt, [record["question"]])[0] > self.limit

    def select(self, sampler, tokenizer, fmt, records: list[dict]) -> list[dict]:
        """``drop``: the batch without its overlong records, each replaced by the next record the sampler draws
        that fits and is not in the batch yet (deterministic, so a resumed run draws the same)."""
        if self.policy != "drop":
            return records
        kept = [r for r in records if not self.is_overlong(tokenizer, fmt, r)]
        missing = len(records) - len(kept)
        if not missing:
            return records
        saved = sampler.batch_size
        try:
            sampler.batch_size = 1
            for _ in range(100 * len(records) + 1000):
                if len(kept) == len(records):
                    return kept
                (r,) = sampler.next_batch()
                if not self.is_overlong(tokenizer, fmt, r) and all(r is not k for k in kept):
                    kept.append(r)
        finally:
            sampler.batch_size = saved
        raise RuntimeError(f"trainer.overlong_prompts=drop: found no prompt within {self.describe()} to draw")

    def fit(self, tokenizer, fmt, question: str) -> str:
        """The rendered prompt of ``question`` within the limit: itself, or with the question's start cut
        (``error``: a ConfigError — ``prepare`` has refused the splits' prompts already)."""
        from rlexp.config.schema import ConfigError

        full = fmt.render_full(tokenizer, question)
        if len(full.encode("utf-8")) <= self.limit - _BYTE_MARGIN:
            return full
        n = len(tokenizer(full, add_special_tokens=False)["input_ids"])
        if n <= self.limit:
            return full
        shown = repr(question[:50] + ("..." if len(question) > 50 else ""))
        if self.policy == "error":
            raise ConfigError(
                f"a prompt of {n} tokens is more than {self.describe()} (question {shown}); "
                "set trainer.overlong_prompts=truncate or drop"
            )
        q_ids = tokenizer(question, add_special_tokens=False)["input_ids"]
        keep = len(q_ids) - (n - self.limit)
        for _ in range(16):
            if keep <= 0:
                break
            text = tokenizer.decode(q_ids[-keep:]).lstrip("\ufffd")  # a cut inside a character: drop its rest
            full = fmt.render_full(tokenizer, text)
            m = len(tokenizer(full, add_special_tokens=False)["input_ids"])
            if m <= self.limit:
                return full
            keep -= max(1, m - self.limit)
        raise ConfigError(
            f"{self.describe()} leaves no room for the question {shown}: the chat template, system prompt and "
            "instruction alone take it (raise trainer.max_prompt_length or shorten prompt.system_prompt)"
        )


_LIMITS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def prompt_limit(trainer) -> PromptLimit | None:
    """The trainer's prompt limit, made and applied to its splits on the first call (its first rollout) and
    attached to its prompt format; None where the model's context is unknown and no limit is set."""
    if trainer in _LIMITS:
        return _LIMITS[trainer]
    s = trainer.s
    max_new_tokens = getattr(trainer.rollout, "max_new_tokens", None) or s.max_new_tokens
    limit = PromptLimit.for_run(
        getattr(s, "max_prompt_length", None),
        getattr(s, "overlong_prompts", "error"),
        model_context(trainer.model),
        max_new_tokens,
    )
    fmt = trainer.prompt_format
    if limit is not None and hasattr(fmt, "render_full"):
        limit.prepare(trainer.tok, fmt, trainer.data.train, trainer.data.eval, s.prompts_per_step)
        fmt.limit = limit
    _LIMITS[trainer] = limit
    return limit
