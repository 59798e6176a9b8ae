"""A benchmark = a data source, a prompt format, an answer extractor and a checker (one entry of
the ``benchmark`` config group; a suite is several entries merged under ``benchmark``)."""

from __future__ import annotations

from rlexp.data.prompts import PromptFormat


class Benchmark:
    def __init__(
        self,
        name: str,
        source,
        prompt: PromptFormat,
        extractor,
        checker,
        limit: int | None = None,
        max_new_tokens: int | None = None,
        description: str = "",
    ):
        if limit is not None and limit < 1:
            raise ValueError(f"benchmark.{name}.limit={limit} must be >= 1 (or null for all problems)")
        self.name, self.source, self.prompt = name, source, prompt
        self.extractor, self.checker = extractor, checker
        self.limit, self.max_new_tokens, self.description = limit, max_new_tokens, description
        self._records: list[dict] | None = None

    @property
    def answer_format(self) -> str | None:
        """The format the stated answer is written in; ``None`` (code) means no consistency measurement."""
        return getattr(self.extractor, "answer_format", None)

    def records(self, limit: int | None = None, exclude_questions: set[str] | frozenset = frozenset()) -> list[dict]:
        """The first ``limit`` problems (``self.limit`` when not given) not in ``exclude_questions``."""
        if self._records is None:
            try:
                self._records = self.source()
            except (ValueError, KeyError, OSError) as e:
                raise ValueError(f"benchmark.{self.name}: {e}") from e
            except RuntimeError as e:
                raise RuntimeError(f"benchmark.{self.name}: {e}") from e
            if not self._records:
                raise ValueError(f"benchmark.{self.name}: the source gave no problems")
        recs = (
            [r for r in self._records if r["question"] not in exclude_questions] if exclude_questions else self._records
        )
        lim = limit if limit is not None else self.limit
        if self.limit is not None and limit is not None:
            lim = min(self.limit, limit)
        return recs[:lim] if lim is not None else list(recs)
