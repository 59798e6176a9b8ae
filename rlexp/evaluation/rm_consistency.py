"""Reward-model consistency on Contrast Instructions (issue 23): "The Trickle-down Impact of Reward (In-)consistency
on RLHF" (Shen, Chen, Song, Jin, Peng, Mi, Khashabi, Yu; 2023; arXiv 2309.16155; ICLR 2024; code and data
github.com/shadowkiller33/Contrast-Instruction).

A Contrast Instructions example pairs two lexically similar instructions I1 (``query``) and I2 (``retrieval``) with
their own human-preferred responses R1 (``query_response_k``) and R2 (``retrieval_response_k``); the benchmark's
``*_response_j`` (less preferred responses) are not used by its metrics. A consistent reward model r ranks each
response highest under its own instruction:

* response consistency — given an instruction, its own response scores higher: r(I1, R1) > r(I1, R2) and
  r(I2, R2) > r(I2, R1);
* instruction consistency — given a response, its own instruction scores higher: r(I1, R1) > r(I2, R1) and
  r(I2, R2) > r(I1, R2).

``rm_consistency`` reports, for each (``res``, ``ins``): ``c_<m>`` — the share of the 2·N comparisons (both
directions of the N pairs) that hold; ``c_<m>_query`` — the query direction alone (what the released evaluation
scripts, ``code/inference*.py``, count: one comparison per example, strict ``>``); ``c_<m>_both`` — the share of
pairs where both directions hold. A tie is not consistent (strict ``>``, as the released code); ``tie_frac`` counts
ties over all comparisons. Pairs whose four scores are not all available (a term failure) are left out
(``unscored``).

RewardFusion (the paper's inference-time fix; released ``code/reward_fusion.py``): a pair's reward is the
similarity-weighted mean of the reward model's scores of the pair itself (similarity 1) and of its most similar
examples in a corpus of (instruction, preferred response) training pairs (at most ``top_k`` = 5 with similarity at
least ``threshold`` = 0.9; the weights are the similarities normalised to sum 1). The released code retrieves with
SimCSE (sup-simcse-roberta-base) over "instruction + answer" texts; ``RewardFusion`` takes any
``embed(texts) -> (n, d)`` function and by default a bag-of-words cosine (ours: no encoder ships offline). ConvexDA
(the paper's training-time augmentation) trains the reward model and is not part of an evaluation.

The reward model is any reward term (``__call__(samples) -> TermResult``): a ``RewardModel``, a ``GenerativeJudge``,
a ``TrajectoryPRMReward``...; it sees ``Sample(prompt=instruction, completion=response, record={"question":
instruction})``. The file is JSONL (one example per line) or a JSON list in the benchmark's schema; a small sample we
wrote ourselves ships as ``rlexp/data/contrast_instructions_sample.jsonl`` (``SAMPLE``; not the benchmark's data).

Command line: ``python -m rlexp.evaluation.rm_consistency --model <sequence-classification RM> [--data FILE]
[--fusion-corpus FILE] [--chat-template]`` prints the metrics as JSON.
"""

from __future__ import annotations

import argparse
import json
import math
import re
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from rlexp.rewards.terms import Sample, TermResult

FIELDS = ("query", "retrieval", "query_response_k", "retrieval_response_k")
SAMPLE = str(Path(__file__).resolve().parent.parent / "data" / "contrast_instructions_sample.jsonl")


def load_contrast_pairs(path: str) -> list[dict]:
    """The examples of a Contrast Instructions file (JSONL, or a JSON list); each needs the four ``FIELDS`` as
    non-empty strings (a ValueError names the example and the field otherwise)."""
    text = Path(path).read_text(encoding="utf-8")
    stripped = text.lstrip()
    if stripped.startswith("["):
        rows = json.loads(stripped)
        where = [f"{path} item {k}" for k in range(len(rows))]
    else:
        rows, where = [], []
        for k, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as e:
                    raise ValueError(f"{path} line {k}: not JSON ({e})") from e
                where.append(f"{path} line {k}")
    for row, at in zip(rows, where):
        if not isinstance(row, dict):
            raise ValueError(f"{at}: an example is a JSON object with fields {list(FIELDS)}")
        for f in FIELDS:
            if not isinstance(row.get(f), str) or not row[f].strip():
                raise ValueError(
                    f"{at}: field {f!r} is missing or empty (Contrast Instructions fields: {list(FIELDS)})"
                )
    return rows


def _sample(instruction: str, response: str, k: int) -> Sample:
    return Sample(instruction, response, {"question": instruction}, k, len(response.split()), False)


def score_pairs(term, pairs: Sequence[tuple[str, str]], batch_size: int = 32) -> list[float | None]:
    """The term's score of each (instruction, response) pair, None where the term failed on it."""
    out: list[float | None] = []
    for k in range(0, len(pairs), batch_size):
        chunk = [_sample(i, r, k + j) for j, (i, r) in enumerate(pairs[k : k + batch_size])]
        res: TermResult = term(chunk)
        fails = res.failures or [False] * len(chunk)
        miss = res.missing or [False] * len(chunk)
        for v, f, m in zip(res.scores, fails, miss):
            ok = not f and not m and v is not None and math.isfinite(float(v))
            out.append(float(v) if ok else None)
    return out


def consistency_metrics(scores: Sequence[Sequence[float | None]]) -> dict[str, float]:
    """The metrics from each example's four scores (r11, r12, r21, r22) = (r(I1,R1), r(I1,R2), r(I2,R1), r(I2,R2))
    (see the module docstring); examples with a missing score are counted in ``unscored`` and left out."""
    full = [s for s in scores if all(v is not None for v in s)]
    n = len(full)
    out = {"pairs": float(len(scores)), "scored": float(n), "unscored": float(len(scores) - n)}
    if not n:
        return {**out, **{k: 0.0 for k in _METRICS}}
    res_q = [r11 > r12 for r11, r12, r21, r22 in full]
    res_r = [r22 > r21 for r11, r12, r21, r22 in full]
    ins_q = [r11 > r21 for r11, r12, r21, r22 in full]
    ins_r = [r22 > r12 for r11, r12, r21, r22 in full]
    ties = sum((r11 == r12) + (r22 == r21) + (r11 == r21) + (r22 == r12) for r11, r12, r21, r22 in full)
    out.update(
        c_res=(sum(res_q) + sum(res_r)) / (2 * n),
        c_ins=(sum(ins_q) + sum(ins_r)) / (2 * n),
        c_res_query=sum(res_q) / n,
        c_ins_query=sum(ins_q) / n,
        c_res_both=sum(a and b for a, b in zip(res_q, res_r)) / n,
        c_ins_both=sum(a and b for a, b in zip(ins_q, ins_r)) / n,
        tie_frac=ties / (4 * n),
        margin_res=sum((r11 - r12) + (r22 - r21) for r11, r12, r21, r22 in full) / (2 * n),
        margin_ins=sum((r11 - r21) + (r22 - r12) for r11, r12, r21, r22 in full) / (2 * n),
    )
    return out


_METRICS = ("c_res", "c_ins", "c_res_query", "c_ins_query", "c_res_both", "c_ins_both", "tie_frac")


def rm_consistency(term, examples: Sequence[dict] | str = SAMPLE, batch_size: int = 32, fusion=None) -> dict:
    """Contrast Instructions consistency of a reward term (``examples``: the loaded examples or a file path).
    ``fusion``: a ``RewardFusion`` to score through instead of the term alone (the paper's inference-time fix)."""
    if isinstance(examples, str):
        examples = load_contrast_pairs(examples)
    scorer = fusion.bind(term) if fusion is not None else term
    pairs = []
    for ex in examples:
        i1, i2, r1, r2 = ex["query"], ex["retrieval"], ex["query_response_k"], ex["retrieval_response_k"]
        pairs += [(i1, r1), (i1, r2), (i2, r1), (i2, r2)]
    flat = score_pairs(scorer, pairs, batch_size)
    return consistency_metrics([flat[4 * k : 4 * k + 4] for k in range(len(examples))])


_WORD = re.compile(r"\w+", re.UNICODE)


def bag_of_words(texts: list[str]) -> torch.Tensor:
    """(n, V) word-count vectors of the texts over their joint vocabulary (lower-cased \\w+ words): our offline
    stand-in for a sentence encoder."""
    counts = [Counter(w.lower() for w in _WORD.findall(t)) for t in texts]
    vocab = {w: k for k, w in enumerate(sorted(set().union(*counts)) if counts else [])}
    out = torch.zeros(len(texts), max(1, len(vocab)))
    for i, c in enumerate(counts):
        for w, m in c.items():
            out[i, vocab[w]] = float(m)
    return out


class RewardFusion:
    """RewardFusion over a corpus of (instruction, response) pairs (module docstring). ``embed``: texts -> (n, d)
    (default ``bag_of_words``); a text is ``template`` of the pair (the released code: instruction, a blank line,
    ``Answer:`` and the response). ``bind(term)`` gives the fused scorer of that term."""

    def __init__(
        self,
        corpus: Sequence[tuple[str, str]],
        embed: Callable[[list[str]], torch.Tensor] | None = None,
        top_k: int = 5,
        threshold: float = 0.9,
        template: str = "{instruction}\n\nAnswer: {response}",
    ):
        if top_k < 0 or not -1.0 <= threshold <= 1.0:
            raise ValueError(f"RewardFusion: top_k ({top_k}) must be >= 0 and threshold ({threshold}) in [-1, 1]")
        if "{instruction}" not in template or "{response}" not in template:
            raise ValueError(f"RewardFusion.template={template!r} needs {{instruction}} and {{response}}")
        self.corpus = [(str(i), str(r)) for i, r in corpus]
        self.embed = embed or bag_of_words
        self.top_k, self.threshold, self.template = int(top_k), float(threshold), template
        self.stats: dict[str, float] = {}

    def text(self, instruction: str, response: str) -> str:
        return self.template.format(instruction=instruction, response=response)

    def neighbours(self, pairs: Sequence[tuple[str, str]]) -> list[list[tuple[int, float]]]:
        """For each pair, its corpus neighbours (index, cosine similarity): the ``top_k`` most similar with
        similarity >= ``threshold``, the pair itself (an identical corpus text) excluded."""
        if not self.corpus or self.top_k == 0:
            return [[] for _ in pairs]
        queries = [self.text(i, r) for i, r in pairs]
        docs = [self.text(i, r) for i, r in self.corpus]
        vecs = torch.nn.functional.normalize(torch.as_tensor(self.embed(queries + docs), dtype=torch.float32), dim=-1)
        sim = vecs[: len(queries)] @ vecs[len(queries) :].T
        out = []
        for qi, q in enumerate(queries):
            found = []
            for j in torch.argsort(sim[qi], descending=True).tolist():
                if len(found) == self.top_k or float(sim[qi, j]) < self.threshold:
                    break
                if docs[j] != q:
                    found.append((j, float(sim[qi, j])))
            out.append(found)
        return out

    def bind(self, term):
        fusion = self

        def fused(samples: list[Sample]) -> TermResult:
            pairs = [(s.prompt, s.completion) for s in samples]
            near = fusion.neighbours(pairs)
            used = sorted({j for row in near for j, _ in row})
            extra = score_pairs(term, [fusion.corpus[j] for j in used]) if used else []
            corpus_score = dict(zip(used, extra))
            own = term(samples)
            fails = list(own.failures or [False] * len(samples))
            scores = []
            for k, (v, row) in enumerate(zip(own.scores, near)):
                parts = [(1.0, float(v))] + [(w, corpus_score[j]) for j, w in row if corpus_score[j] is not None]
                total = sum(w for w, _ in parts)
                scores.append(sum(w * x for w, x in parts) / total)
            fusion.stats = {
                "fused_frac": sum(bool(r) for r in near) / max(1, len(near)),
                "neighbours_mean": sum(len(r) for r in near) / max(1, len(near)),
            }
            return TermResult(scores, fails, list(own.missing or [False] * len(samples)))

        return fused


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(
        prog="python -m rlexp.evaluation.rm_consistency", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--model", required=True, help="a sequence-classification reward model (hub id or path)")
    parser.add_argument("--data", default=SAMPLE, help="Contrast Instructions JSONL/JSON (default: the shipped sample)")
    parser.add_argument("--fusion-corpus", default=None, help="JSONL of {instruction, response} pairs: RewardFusion")
    parser.add_argument("--chat-template", action="store_true", help="render pairs with the RM's chat template")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--batch-size", type=int, default=16)
    args = parser.parse_args(argv)
    from rlexp.rewards.reward_model import RewardModel

    term = RewardModel(model=args.model, device=args.device, chat_template=args.chat_template, cache=0)
    fusion = None
    if args.fusion_corpus:
        rows = [json.loads(line) for line in Path(args.fusion_corpus).read_text().splitlines() if line.strip()]
        fusion = RewardFusion([(r["instruction"], r["response"]) for r in rows])
    metrics = rm_consistency(term, args.data, args.batch_size, fusion)
    print(json.dumps(metrics, indent=2))
    return metrics


if __name__ == "__main__":
    main()
