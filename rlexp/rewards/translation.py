"""Translation quality as a reward: sentence-level BLEU of the stated translation against the record's reference
(issue 28; the BLEU reward of "Improving Low-Resource Translation with Dictionary-Guided Fine-Tuning and RL: A
Spanish-to-Wayuunaiki Study", 2025, arXiv 2508.19481, whose policy writes its translation inside ``<answer>`` tags).

The hypothesis is the completion's last answer in ``answer_format`` (``tag``: the last ``<answer>…</answer>``; in a
multi-turn episode the completion is the policy's turns, never a tool's output); a completion that states none
scores 0 (``missing_answer: zero``) or is scored whole (``text``). The reference is ``record["answer"]`` (with
``record["metadata"]["references"]``, a list, as further references when present). The score is sacreBLEU's
``sentence_bleu`` (Post, 2018: 13a tokenisation, exponential smoothing, brevity penalty; case-sensitive unless
``lowercase``) divided by 100, in [0, 1]; ``metric: chrf`` takes sacreBLEU's sentence chrF instead (the AmericasNLP
shared task's main metric), also over 100. Needs ``sacrebleu`` (``pip install 'rlexp[agents]'``).

Metrics, as ``reward/<term>/...``: ``answered`` (share of completions stating a translation) and ``score100`` (the
mean on sacreBLEU's 0-100 scale)."""

from __future__ import annotations

from rlexp.core.registry import REWARDS
from rlexp.rewards.answers import extract_answer
from rlexp.rewards.terms import RewardTerm, Sample, TermResult

METRICS = ("bleu", "chrf")
MISSING = ("zero", "text")


def _sacrebleu():
    try:
        import sacrebleu
    except ImportError as e:  # pragma: no cover - the agents extra installs it
        raise ImportError("reward=bleu needs sacrebleu: pip install 'rlexp[agents]' (or sacrebleu==2.6.0)") from e
    return sacrebleu


def references(record: dict) -> list[str]:
    """The reference translations of a record: its answer, then ``metadata.references`` (if any)."""
    refs = [str(record["answer"])]
    extra = (record.get("metadata") or {}).get("references") or []
    return refs + [str(r) for r in extra if str(r) not in refs]


@REWARDS.register
class TranslationBLEU(RewardTerm):
    """Sentence BLEU (or chrF) / 100 of the stated translation against the record's reference(s); module doc."""

    def __init__(
        self,
        weight: float = 1.0,
        answer_format: str = "tag",
        metric: str = "bleu",
        missing_answer: str = "zero",
        lowercase: bool = False,
        tokenize: str = "13a",
        smooth_method: str = "exp",
    ):
        super().__init__(weight)
        if metric not in METRICS:
            raise ValueError(f"reward term TranslationBLEU.metric={metric!r} is not one of {list(METRICS)}")
        if missing_answer not in MISSING:
            raise ValueError(
                f"reward term TranslationBLEU.missing_answer={missing_answer!r} is not one of {list(MISSING)}"
            )
        self.sacrebleu = _sacrebleu()
        self.answer_format, self.metric, self.missing = answer_format, metric, missing_answer
        self.lowercase, self.tokenize, self.smooth_method = lowercase, tokenize, smooth_method
        extract_answer("", answer_format)  # refuses an unknown format now, not at the first step

    def hypothesis(self, completion: str) -> str | None:
        stated = extract_answer(completion, self.answer_format, fallback_last_number=False)
        if stated is None and self.missing == "text":
            return completion
        return None if stated is None else stated.strip()

    def score100(self, hypothesis: str, refs: list[str]) -> float:
        """sacreBLEU's sentence score (0-100) of ``hypothesis`` against ``refs``."""
        if self.metric == "chrf":
            return float(self.sacrebleu.sentence_chrf(hypothesis, refs).score)
        return float(
            self.sacrebleu.sentence_bleu(
                hypothesis, refs, smooth_method=self.smooth_method, lowercase=self.lowercase, tokenize=self.tokenize
            ).score
        )

    def __call__(self, samples: list[Sample]) -> TermResult:
        scores, failures, answered = [], [], 0
        for s in samples:
            hyp = self.hypothesis(s.completion)
            if hyp is None:
                scores.append(0.0)
                failures.append(False)
                continue
            answered += 1
            try:
                scores.append(self.score100(hyp, references(s.record)) / 100.0)
                failures.append(False)
            except Exception:  # a sample that cannot be scored is a recorded failure, never a crashed run
                scores.append(0.0)
                failures.append(True)
        n = max(1, len(samples))
        metrics = {"answered": answered / n, "score100": 100.0 * sum(scores) / n}
        return TermResult(scores, failures, metrics=metrics)
