"""A second model trained beside the policy (issue 23): a reward model or a verifier with its own AdamW optimiser,
updated at every step from the policy's rule-verified rollouts. Its weights, optimiser state and counters are the
stage's ``state_dict`` (the checkpoint keeps group stages' state by position), so a resumed run continues it.

* ``CooperRewardModel`` — Cooper ("Cooper: Co-Optimizing Policy and Reward Models in Reinforcement Learning for Large
  Language Models", Hong et al., 2025; arXiv 2508.05613; released code ZJU-REAL/Cooper, read for this module:
  ``recipe/cooper/dp_reward.py``, ``collaborate.py``, ``fsdp_workers.py``, ``test_qwen2.5-1.5B-Instruct.sh``). A
  reference-based reward model — a sequence classifier with one output whose input is the question, the reference
  answer and the response (``<question>…</question>\\n<reference_answer>…</reference_answer>\\n<completion>…
  </completion>``; an answer or response over 1500 characters keeps its first 500 and last 1000) — scores each
  rollout; σ(logit) is the rollout's reward (the release's ``reward_scale: False``; its reward manager returns the
  model's score alone, so the rule enters only through the pairs: ``rule_weight: 0``). Then the reward model takes
  one AdamW step (lr 1e-5, weight decay 0.01, gradient norm clipped at 1) on the contrastive loss
  −mean log σ(s⁺ − s⁻) over the step's pairs: per prompt, the first rollout the rule verifier finds correct (the
  release's positive) against a negative. The paper's negatives are written by an assistant LLM that rewrites the
  positive into a wrong answer (checked wrong by math-verify); ours are rule-wrong rollouts of the same group — by
  default the one the reward model scores highest (``negative: hardest``; ``first``, ``random``), our choice — so a
  group with no correct or no wrong rollout gives no pair (the release: a group with no positive gives none). By
  default the reward model starts from the policy's initial weights with a fresh 1-output head (the release starts
  from its trained VerifyRM, ``model``: a sequence-classification checkpoint).
* ``TangoVerifier`` — RL Tango ("RL Tango: Reinforcing Generator and Verifier Together for Language Reasoning", Zha
  et al., 2025; arXiv 2505.15034; released code kaiwenzha/RL-Tango, read for this module:
  ``verl/trainer/ppo/rl_tango_trainer.py``, ``verl/workers/verifier_worker.py``, ``verl/utils/reward_score/
  format.py``, ``verl/trainer/ppo/core_algos.py``, ``data_preprocess/system_prompt.py``, ``scripts/run_rl_tango.sh``).
  A generative process verifier — a causal LM of its own, by default a copy of the initial policy (the release: the
  base model Qwen2.5-7B) — reads each solution cut into steps and writes a verdict per step and a final verdict
  (``<step_verification><step>… \\boxed{CORRECT}</step>…</step_verification><final_verification>\\boxed{…}
  </final_verification>``). The generator is paid the rule outcome plus, when the verifier judged exactly as many
  steps as the solution has, ±1/n at each step's last token (CORRECT: +, INCORRECT: −; averaged over the solution's
  verifications), times α_t, which decays exponentially from ``alpha_start`` to ``alpha_min`` over the training
  (the release's ``get_alpha``). The verifier is trained by RL on outcome-level rewards only: K sampled
  verifications per solution (the release's ``verifier.rollout.n`` 5), each rewarded 1 when its final verdict
  matches the rule outcome (``correctness_weight``) plus 0.8 × a format score (the release's
  ``verifier_format_reward``: 1 minus 0.8 without a boxed final verdict, 0.8 without step blocks or with another
  number of judged steps than the solution's — the release checks that count only for well-formatted solutions,
  ours always —, 0.4 for text outside the step blocks; 0 when the reply is not the two sections), per-sample
  weights against the class imbalance of the outcomes (``reweight: sqrt_inverse`` over EMA counts, decay 0.8,
  normalised to mean 1), GRPO advantages over the K, the PPO clipped loss (ε 0.2, token mean),
  k3 KL (verl's low_var_kl) 0.001 to the initial verifier and an entropy bonus 0.001, AdamW lr 1e-6. The step
  rewards go to ``batch.extras["token_rewards"]`` (REINFORCE++ and GAE consume them: the release's
  REINFORCE++ setting, α₀ = 0.5); the release's GRPO form normalises the step rewards within each group and mixes
  (1 − α)·A_outcome + α·A_process, which no estimator here does: ours adds α·step rewards to the token rewards
  and REINFORCE++ whitens the sum (the release whitens the two apart). Our choices: the solution cut by
  ``split_steps`` (the release's generator writes <step> tags under its own prompt; we keep the run's prompt and
  show the verifier the steps numbered), the verifier trained every step (``update_every``; the release alternates
  3 generator steps with 1 verifier step after 40 verifier-only warm-up steps — ``warmup_steps`` here pays no step
  rewards while the verifier trains, since the policy trains every step) on ``solutions_per_group`` solutions per
  group (the release samples one solution per prompt for its verifier steps), K = 4, our prompt wording, the
  reply pre-filled with the step section's opening in the method's config (``reply_prefix``; the release: none).

Both stages leave the batch's rows as they are; they read the run's rule term ``label_term`` (correct when its score
is ≥ ``correct_min``).
"""

from __future__ import annotations

import copy
import logging
import math
import random
import re
import time
from collections.abc import Sequence

import torch
import torch.nn.functional as F

from rlexp.algorithms.group_stages.base import append_reward_column, stage_setting
from rlexp.algorithms.losses.clip import ppo_clip
from rlexp.algorithms.regularisers.kl import kl_estimate
from rlexp.core.batch import RolloutBatch
from rlexp.core.forward import token_logprobs
from rlexp.core.masks import TOKEN_REWARDS
from rlexp.core.registry import GROUP_STAGES
from rlexp.core.stats import group_stats
from rlexp.rewards.judges import compile_pattern, parse_score
from rlexp.rewards.process import SPLIT_MODES, split_steps, token_positions
from rlexp.rewards.reward_model import load_reward_model, model_source, render_pairs

log = logging.getLogger(__name__)


# ---- shared: a second model with its own optimiser ------------------------------------------------------------------
def _unwrap(model):
    """The module itself under a ``torch.compile`` wrapper."""
    return getattr(model, "_orig_mod", model)


def _refuse_peft(policy, who: str) -> None:
    from rlexp.models.peft import is_peft

    if is_peft(policy):
        raise ValueError(
            f"algorithm.group_stages: {who} copies the policy's weights into a model of its own, which a LoRA "
            "policy (model/peft=lora) does not have in full: give the stage a model of its own (its `model` setting)"
        )


class CoTrained:
    """A model trained beside the policy with its own AdamW (``lr``, ``weight_decay``, ``betas``, gradient norm
    clipped at ``max_grad_norm``), built at the stage's first call (``build``); ``state_dict`` holds its weights,
    the optimiser's state, the number of optimiser steps (``updates``) and the stage's own counters; a state loaded
    before the model exists (a resumed run) is applied when it is built."""

    needs_reference = False
    who = "CoTrained"

    def __init__(self, lr: float, weight_decay: float, betas: Sequence[float], max_grad_norm: float | None):
        where = f"algorithm.group_stages: {self.who}"
        if not lr > 0:
            raise ValueError(f"{where}.lr={lr} must be > 0")
        if weight_decay < 0:
            raise ValueError(f"{where}.weight_decay={weight_decay} must be >= 0")
        betas = tuple(float(b) for b in betas)
        if len(betas) != 2 or not all(0.0 <= b < 1.0 for b in betas):
            raise ValueError(f"{where}.betas={list(betas)}: two numbers in [0, 1)")
        if max_grad_norm is not None and not max_grad_norm > 0:
            raise ValueError(f"{where}.max_grad_norm={max_grad_norm} must be > 0 or null")
        self.lr, self.weight_decay, self.betas = float(lr), float(weight_decay), betas
        self.max_grad_norm = None if max_grad_norm is None else float(max_grad_norm)
        self.model = None
        self.tokenizer = None
        self.optimizer = None
        self.updates = 0
        self._pending: dict | None = None

    # the model -----------------------------------------------------------------------------------------------------
    def make_model(self, ctx):
        """(trainable model, tokenizer): the stage's second model, before its optimiser exists."""
        raise NotImplementedError

    def build(self, ctx) -> None:
        if self.model is not None:
            return
        model, tok = self.make_model(ctx)
        model.requires_grad_(True)
        self.model, self.tokenizer = model, tok
        params = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(params, lr=self.lr, betas=self.betas, weight_decay=self.weight_decay)
        if self._pending is not None:
            self._apply(self._pending)
            self._pending = None

    def optimizer_step(self) -> float:
        """Clip, step, zero the gradients; the gradient norm (a non-finite norm skips the step, as verl)."""
        params = [p for p in self.model.parameters() if p.requires_grad]
        limit = self.max_grad_norm if self.max_grad_norm is not None else float("inf")
        norm = float(torch.nn.utils.clip_grad_norm_(params, limit))
        if math.isfinite(norm):
            self.optimizer.step()
            self.updates += 1
        else:
            log.warning("%s: gradient norm %s is not finite; optimiser step skipped", self.who, norm)
        self.optimizer.zero_grad(set_to_none=True)
        return norm

    # state ----------------------------------------------------------------------------------------------------------
    def extra_state(self) -> dict:
        return {}

    def load_extra_state(self, state: dict) -> None:
        pass

    def state_dict(self) -> dict | None:
        if self.model is None:  # not built yet: whatever was loaded (a checkpoint before the first step)
            return self._pending
        return {
            "model": {k: v.detach().clone() for k, v in self.model.state_dict().items()},
            "optimizer": copy.deepcopy(self.optimizer.state_dict()),
            "updates": self.updates,
            **self.extra_state(),
        }

    def load_state_dict(self, state: dict | None) -> None:
        if not state:
            return
        if self.model is None:
            self._pending = state
        else:
            self._apply(state)

    def _apply(self, state: dict) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.updates = int(state.get("updates", 0))
        self.load_extra_state(state)


def _autocast(ctx, device: torch.device):
    dtype = getattr(ctx, "autocast_dtype", None)
    return torch.autocast(device.type, dtype=dtype or torch.bfloat16, enabled=dtype is not None)


def _rule_correct(batch: RolloutBatch, label_term: str, correct_min: float, who: str) -> list[bool]:
    if label_term not in batch.reward_names:
        raise KeyError(
            f"algorithm.group_stages: {who}.label_term={label_term!r} is not a reward term (terms: "
            f"{batch.reward_names}); the stage reads the rule verifier's outcome from it (reward=accuracy)"
        )
    return (batch.term(label_term).float() >= correct_min).tolist()


def _set_weight(batch: RolloutBatch, term: str, weight: float) -> None:
    """The term's weight in the total reward becomes ``weight`` (its column stays, logged)."""
    j = batch.reward_names.index(term)
    old = float(batch.reward_weights[j]) if batch.reward_weights is not None else 1.0
    if old == weight:
        return
    batch.reward = batch.reward + (weight - old) * batch.rewards[:, j].to(batch.reward.dtype)
    batch.reward_weights = batch.reward_weights.clone()
    batch.reward_weights[j] = weight


def _question(batch: RolloutBatch, i: int, key: str) -> str:
    record = batch.records[i] if batch.records else None
    return str(record.get(key, batch.prompts[i])) if isinstance(record, dict) else batch.prompts[i]


# ---- Cooper ---------------------------------------------------------------------------------------------------------
COOPER_TEMPLATE = (
    "<question>{question}</question>\n<reference_answer>{reference}</reference_answer>\n<completion>{completion}"
    "</completion>"
)
NEGATIVES = ("hardest", "first", "random")


def clip_middle(text: str, limit: int = 1500, head: int = 500) -> str:
    """The release's cut of a long answer or response: over ``limit`` characters, its first ``head`` and its last
    ``limit − head`` (500 + 1000)."""
    if limit <= 0 or len(text) <= limit:
        return text
    return text[:head] + text[-(limit - head) :]


def contrastive_loss(pos: torch.Tensor, neg: torch.Tensor) -> torch.Tensor:
    """Cooper's reward-model loss: −mean log σ(s⁺ − s⁻) over the pairs (the release's ``update_reward``)."""
    return -F.logsigmoid(pos.float() - neg.float()).mean()


def cooper_pairs(
    group_ids: Sequence[int],
    correct: Sequence[bool],
    scores: Sequence[float],
    negative: str = "hardest",
    per_group: int = 1,
    rng: random.Random | None = None,
) -> list[tuple[int, int]]:
    """(positive row, negative row) pairs, per group: its first ``per_group`` rule-correct rows in order (the
    release's positive: the first correct rollout of each prompt), each against a distinct rule-wrong row of the
    group — ``hardest``: highest reward-model score first, ``first``: in row order, ``random``: drawn with ``rng``.
    A group with no correct or no wrong row gives none."""
    if negative not in NEGATIVES:
        raise ValueError(f"negative={negative!r} is not one of {list(NEGATIVES)}")
    rows: dict[int, list[int]] = {}
    for i, g in enumerate(group_ids):
        rows.setdefault(int(g), []).append(i)
    pairs = []
    for members in rows.values():
        pos = [i for i in members if correct[i]]
        neg = [i for i in members if not correct[i]]
        if negative == "hardest":
            neg = sorted(neg, key=lambda i: -scores[i])  # stable: ties keep row order
        elif negative == "random":
            (rng or random.Random(0)).shuffle(neg)
        pairs += list(zip(pos[: max(0, per_group)], neg))
    return pairs


@GROUP_STAGES.register
class CooperRewardModel(CoTrained):
    """Cooper (module doc): a reference-based reward model scores the rollouts (σ(logit), column ``name`` at
    ``weight``; ``rule_weight``: the rule term's weight in the total, null: as the run set it), then takes a step on
    the contrastive loss over (rule-correct, rule-wrong) pairs of the same group.

    ``model``: null (the policy's initial weights with a fresh 1-output head) or a sequence-classification
    checkpoint (a hub id, a local path or a ``model/`` config of ``source: hub``; ``revision``). ``template``
    ({question}, {reference}, {completion}; the release's tags), or ``chat_template: true``: the reward model's chat
    of (user: the question and ``Reference answer: …``, assistant: the response). ``clip_chars``: the release's cut of
    long answers and responses (0: none); inputs over ``max_length`` tokens keep their end. ``negative``,
    ``pairs_per_group``: the pairs (``cooper_pairs``); ``epochs``: passes over the pairs (one optimiser step each);
    ``batch_size``: rows per forward. ``binarise``: the reward 1[σ > 0.5] (the release's ``reward_scale``).

    Metrics: ``cooper/rm_loss`` (the contrastive loss the step descended), ``cooper/rm_pair_acc`` (pairs the reward
    model ranked right before its step), ``cooper/rm_pairs``, ``cooper/rm_valid_rate`` (groups with a pair, the
    release's ``reward/valid_rate``), ``cooper/rm_updates`` (its optimiser steps so far), ``cooper/rm_grad_norm``,
    ``cooper/rm_score_mean``, ``cooper/rm_score_correct_mean``, ``cooper/rm_score_wrong_mean``,
    ``cooper/rm_rule_agreement`` (rows where σ > 0.5 agrees with the rule), ``cooper/rm_truncated``,
    ``time/cooper_s``."""

    who = "CooperRewardModel"

    def __init__(
        self,
        model=None,
        name: str = "cooper_rm",
        weight: float = 1.0,
        label_term: str = "accuracy",
        correct_min: float = 1.0,
        rule_weight: float | None = 0.0,
        negative: str = "hardest",
        pairs_per_group: int = 1,
        template: str = COOPER_TEMPLATE,
        chat_template: bool = False,
        clip_chars: int = 1500,
        max_length: int = 1024,
        batch_size: int = 8,
        epochs: int = 1,
        binarise: bool = False,
        lr: float = 1e-5,
        weight_decay: float = 0.01,
        betas: Sequence[float] = (0.9, 0.999),
        max_grad_norm: float | None = 1.0,
        question_key: str = "question",
        answer_key: str = "answer",
        revision: str | None = None,
        seed: int = 0,
    ):
        super().__init__(lr, weight_decay, betas, max_grad_norm)
        where = "algorithm.group_stages: CooperRewardModel"
        self.source = None if model is None else model_source(model)
        if revision is not None and self.source is not None:
            self.source = (self.source[0], self.source[1] or revision)
        if not name:
            raise ValueError(f"{where}.name is empty: the reward model's column needs a name")
        if negative not in NEGATIVES:
            raise ValueError(f"{where}.negative={negative!r} is not one of {list(NEGATIVES)}")
        for key, value in (("pairs_per_group", pairs_per_group), ("batch_size", batch_size), ("epochs", epochs)):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{where}.{key}={value!r} must be an integer >= 1")
        if max_length < 8:
            raise ValueError(f"{where}.max_length={max_length} must be >= 8")
        if not chat_template:
            missing = [f for f in ("question", "reference", "completion") if "{" + f + "}" not in template]
            if missing:
                raise ValueError(f"{where}.template lacks {', '.join('{' + f + '}' for f in missing)}")
        self.name, self.weight, self.label_term = name, float(weight), label_term
        self.correct_min = float(correct_min)
        self.rule_weight = None if rule_weight is None else float(rule_weight)
        self.negative, self.pairs_per_group = negative, pairs_per_group
        self.template, self.chat_template, self.clip_chars = template, bool(chat_template), int(clip_chars)
        self.max_length, self.batch_size, self.epochs = int(max_length), batch_size, epochs
        self.binarise, self.question_key, self.answer_key = bool(binarise), question_key, answer_key
        self.seed = int(seed)

    # the model -----------------------------------------------------------------------------------------------------
    def make_model(self, ctx):
        policy = _unwrap(ctx.policy)
        param = next(policy.parameters())
        if self.source is not None:
            loaded, tok = load_reward_model(self.source[0], param.device, param.dtype, self.source[1])
            if loaded.config.num_labels < 1:
                raise ValueError(f"CooperRewardModel.model {self.source[0]!r} has no output label")
            return copy.deepcopy(loaded).train(), tok  # the process-wide cached model stays frozen
        _refuse_peft(policy, self.who)
        return policy_reward_model(policy, ctx.tokenizer), ctx.tokenizer

    # inputs and scores ---------------------------------------------------------------------------------------------
    def texts(self, batch: RolloutBatch, rows: Sequence[int]) -> list[str]:
        questions = [_question(batch, i, self.question_key) for i in rows]
        refs = [clip_middle(str((batch.records[i] or {}).get(self.answer_key, "")), self.clip_chars) for i in rows]
        comps = [clip_middle(batch.completions[i], self.clip_chars) for i in rows]
        if self.chat_template:
            users = [f"{q}\n\nReference answer: {r}" for q, r in zip(questions, refs)]
            return render_pairs(self.tokenizer, users, comps, True)[0]
        return [self.template.format(question=q, reference=r, completion=c) for q, r, c in zip(questions, refs, comps)]

    def logits(self, texts: Sequence[str], ctx) -> tuple[torch.Tensor, int]:
        """(N,) float32 logits of ``texts`` (right padding, inputs over ``max_length`` keep their end), with the
        graph when gradients are on; and how many inputs were cut."""
        tok, model = self.tokenizer, self.model
        device = next(model.parameters()).device
        side, trunc = tok.padding_side, getattr(tok, "truncation_side", "right")
        tok.padding_side, tok.truncation_side = "right", "left"
        out, cut = [], 0
        try:
            for k in range(0, len(texts), self.batch_size):
                chunk = list(texts[k : k + self.batch_size])
                cut += sum(len(ids) > self.max_length for ids in tok(chunk, add_special_tokens=False)["input_ids"])
                enc = tok(
                    chunk,
                    return_tensors="pt",
                    padding=True,
                    truncation=True,
                    max_length=self.max_length,
                    add_special_tokens=False,
                ).to(device)
                with _autocast(ctx, device):
                    out.append(model(**enc).logits[:, 0].float())
        finally:
            tok.padding_side, tok.truncation_side = side, trunc
        return (torch.cat(out) if out else torch.empty(0, device=device)), cut

    # the stage ------------------------------------------------------------------------------------------------------
    def __call__(self, batch: RolloutBatch, ctx) -> RolloutBatch:
        if len(batch) == 0:
            return batch
        t0 = time.perf_counter()
        correct = _rule_correct(batch, self.label_term, self.correct_min, self.who)
        self.build(ctx)
        if self.chat_template and not getattr(self.tokenizer, "chat_template", None):
            raise ValueError(
                "algorithm.group_stages: CooperRewardModel.chat_template=true but the reward model's tokenizer has no "
                "chat template: set chat_template=false (the tagged template)"
            )
        texts = self.texts(batch, range(len(batch)))
        self.model.eval()
        with torch.no_grad():
            logits, cut = self.logits(texts, ctx)
        probs = torch.sigmoid(logits).cpu()
        reward = (probs > 0.5).float() if self.binarise else probs
        if self.rule_weight is not None:
            _set_weight(batch, self.label_term, self.rule_weight)
        batch = append_reward_column(batch, self.name, reward, self.weight)
        scores = logits.detach().cpu().tolist()
        step = int(getattr(ctx, "step", 0) or 0)
        rng = random.Random(self.seed * 1_000_003 + step)
        groups = batch.group_ids.tolist()
        pairs = cooper_pairs(groups, correct, scores, self.negative, self.pairs_per_group, rng)
        stats = self.update(pairs, texts, scores, ctx)
        n_groups = len(set(groups))
        right = [probs[i].item() for i in range(len(batch)) if correct[i]]
        wrong = [probs[i].item() for i in range(len(batch)) if not correct[i]]
        stats.update(
            {
                "cooper/rm_pairs": float(len(pairs)),
                "cooper/rm_valid_rate": len({groups[p] for p, _ in pairs}) / n_groups if n_groups else 0.0,
                "cooper/rm_updates": float(self.updates),
                "cooper/rm_score_mean": float(probs.mean()),
                "cooper/rm_score_correct_mean": sum(right) / len(right) if right else 0.0,
                "cooper/rm_score_wrong_mean": sum(wrong) / len(wrong) if wrong else 0.0,
                "cooper/rm_rule_agreement": sum((p > 0.5) == c for p, c in zip(probs.tolist(), correct)) / len(batch),
                "cooper/rm_truncated": float(cut),
                "time/cooper_s": time.perf_counter() - t0,
            }
        )
        batch.stats.update(stats)
        return batch

    def update(self, pairs: list[tuple[int, int]], texts: list[str], scores: list[float], ctx) -> dict:
        """``epochs`` optimiser steps on the contrastive loss over ``pairs`` (gradients accumulated over forwards of
        ``batch_size`` pairs, the loss a mean over all pairs); no pair, no step."""
        if not pairs:
            return {"cooper/rm_loss": 0.0, "cooper/rm_pair_acc": 0.0, "cooper/rm_grad_norm": 0.0}
        acc = sum(scores[p] > scores[n] for p, n in pairs) / len(pairs)
        self.model.train()
        losses, norms = [], []
        for _ in range(self.epochs):
            total = 0.0
            for k in range(0, len(pairs), self.batch_size):
                chunk = pairs[k : k + self.batch_size]
                pos, _ = self.logits([texts[p] for p, _ in chunk], ctx)
                neg, _ = self.logits([texts[n] for _, n in chunk], ctx)
                loss = contrastive_loss(pos, neg) * (len(chunk) / len(pairs))
                loss.backward()
                total += float(loss.detach())
            losses.append(total)
            norms.append(self.optimizer_step())
        self.model.eval()
        return {"cooper/rm_loss": losses[0], "cooper/rm_pair_acc": acc, "cooper/rm_grad_norm": norms[-1]}


def policy_reward_model(policy, tokenizer):
    """A sequence classifier of the policy's architecture with the policy's trunk weights (its initial weights at the
    first step) and a fresh 1-output head (the model's own initialisation), on the policy's device and dtype."""
    from transformers import AutoModelForSequenceClassification

    config = copy.deepcopy(policy.config)
    config.num_labels = 1
    if getattr(config, "pad_token_id", None) is None:  # batches of several rows: the last non-pad token
        config.pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    param = next(policy.parameters())
    rm = AutoModelForSequenceClassification.from_config(config, dtype=param.dtype)
    trunk = getattr(policy, policy.base_model_prefix, None)
    target = getattr(rm, rm.base_model_prefix, None)
    if trunk is None or target is None:
        raise ValueError(
            f"CooperRewardModel: cannot find the trunk of {type(policy).__name__} (base_model_prefix "
            f"{policy.base_model_prefix!r}); give the stage a sequence-classification checkpoint (its `model`)"
        )
    target.load_state_dict(trunk.state_dict())
    return rm.to(param.device).train()


# ---- RL Tango -------------------------------------------------------------------------------------------------------
VERIFIER_TEMPLATE = (
    "You check a solution to a math problem step by step.\n\n"
    "Problem:\n{problem}\n\n"
    "Solution, in {steps} numbered steps:\n{solution}\n\n"
    "Check every step in order: is its reasoning and arithmetic right? Then judge whether the final answer is right. "
    "Reply in exactly this format, with one <step> block for each of the {steps} steps and nothing else:\n"
    "<step_verification>\n"
    "<step>Step 1: your check of step 1. \\boxed{{CORRECT}} or \\boxed{{INCORRECT}}</step>\n"
    "<step>Step 2: your check of step 2. \\boxed{{CORRECT}} or \\boxed{{INCORRECT}}</step>\n"
    "...\n"
    "</step_verification>\n"
    "<final_verification>\\boxed{{CORRECT}} or \\boxed{{INCORRECT}}</final_verification>"
)
VERDICTS = {"correct": 1.0, "incorrect": 0.0}
FINAL_PATTERN = r"<final_verification>\s*\\box(?:ed)?\{\s*(CORRECT|INCORRECT)\s*\}"
STEP_VERDICT_PATTERN = r"\\box(?:ed)?\{\s*(CORRECT|INCORRECT)\s*\}"
_SECTIONS = re.compile(
    r"^<step_verification>(.*?)</step_verification>\s*<final_verification>(.*?)</final_verification>$", re.S
)
_STEP_BLOCK = re.compile(r"<step>(.*?)</step>", re.S)
_STEP_SECTION = re.compile(r"<step_verification>(.*?)</step_verification>", re.S)
REWEIGHTS = ("none", "inverse", "sqrt_inverse")
SCHEDULES = ("exp", "linear", "cosine", "constant")


def parse_verification(text: str) -> tuple[float | None, list[float | None]]:
    """(final verdict, step verdicts) of a verification: 1.0 CORRECT, 0.0 INCORRECT, None when missing — the final
    one from ``<final_verification>\\boxed{…}``, one per ``<step>`` block inside ``<step_verification>`` (its last
    boxed verdict), read with ``parse_score``."""
    final = parse_score(text or "", _FINAL_RX, verdicts=VERDICTS)
    section = _STEP_SECTION.search(text or "")
    blocks = _STEP_BLOCK.findall(section.group(1)) if section else []
    return final, [parse_score(b, _STEP_RX, verdicts=VERDICTS) for b in blocks]


def verifier_format_score(text: str, n_steps: int) -> float:
    """The release's format reward of a verification (``verifier_format_reward``): 0 unless the reply is the step
    section then the final section; else 1 minus 0.8 when the final section has no boxed verdict, 0.8 when there is
    no step block or the judged steps are not ``n_steps``, 0.4 for text outside the step blocks; at least 0."""
    m = _SECTIONS.match((text or "").strip())
    if not m:
        return 0.0
    steps, final = m.group(1).strip(), m.group(2).strip()
    score = 1.0
    if parse_score(final, re.compile(STEP_VERDICT_PATTERN + r"\.?\s*$", re.I), verdicts=VERDICTS) is None:
        score -= 0.8
    blocks = _STEP_BLOCK.findall(steps)
    if not blocks:
        score -= 0.8
    elif sum(parse_score(b, _STEP_RX, verdicts=VERDICTS) is not None for b in blocks) != n_steps:
        score -= 0.8
    if re.sub(r"\s+", "", _STEP_BLOCK.sub("", steps)):
        score -= 0.4
    return max(0.0, min(1.0, score))


def verifier_reward(
    final: float | None, outcome: bool, format_score: float, correctness_weight: float = 1.0, format_weight: float = 0.8
) -> float:
    """A verification's reward: ``correctness_weight`` when its final verdict parsed and agrees with the rule
    outcome (CORRECT for a correct solution, INCORRECT for a wrong one), plus ``format_weight`` × its format score."""
    right = final is not None and (final >= 0.5) == bool(outcome)
    return correctness_weight * float(right) + format_weight * float(format_score)


def step_rewards(verdicts: Sequence[float | None], n_steps: int) -> list[float] | None:
    """±1/n per step (CORRECT +, INCORRECT −) when the verification judged exactly the ``n_steps`` steps of the
    solution, each with a verdict; None otherwise (the release pays nothing then)."""
    if n_steps < 1 or len(verdicts) != n_steps or any(v is None for v in verdicts):
        return None
    return [(1.0 if v >= 0.5 else -1.0) / n_steps for v in verdicts]


def alpha_at(t: int, total: int, start: float, minimum: float, schedule: str = "exp", frac: float = 1.0) -> float:
    """The weight of the step rewards after ``t`` generator steps of ``total`` (the release's ``get_alpha``):
    ``exp``: start·exp(−k·t), k = ln(start/min)/(frac·total); ``linear``; ``cosine``; ``constant``; never below
    ``minimum``. t < 0 (warm-up): 0."""
    if t < 0:
        return 0.0
    if schedule == "constant" or total <= 0:
        return start
    if schedule == "exp":
        value = start * math.exp(-math.log(start / minimum) / (frac * total) * t)
    elif schedule == "linear":
        value = start - (start - minimum) * t / total
    elif schedule == "cosine":
        value = minimum + 0.5 * (start - minimum) * (1 + math.cos(math.pi * t / total))
    else:
        raise ValueError(f"alpha_schedule={schedule!r} is not one of {list(SCHEDULES)}")
    return max(minimum, value)


def class_coefficients(
    labels: Sequence[bool], counts: tuple[float, float] | None, decay: float, method: str
) -> tuple[list[float], tuple[float, float] | None]:
    """Per-sample weights against the class imbalance of the rule outcomes (the release's reweighting): the EMA of
    the (correct, wrong) counts (the first batch's counts, then decay·old + (1 − decay)·new), a coefficient
    1/count (``inverse``) or 1/√count (``sqrt_inverse``) per class, scaled to mean 1 over ``labels``. ``none``: all
    1, counts unchanged."""
    if method == "none" or not labels:
        return [1.0] * len(labels), counts
    pos = float(sum(bool(x) for x in labels))
    neg = float(len(labels)) - pos
    if counts is None:
        counts = (pos, neg)
    else:
        counts = (decay * counts[0] + (1 - decay) * pos, decay * counts[1] + (1 - decay) * neg)
    root = math.sqrt if method == "sqrt_inverse" else (lambda x: x)
    coef = (1.0 / (root(counts[0]) + 1e-6), 1.0 / (root(counts[1]) + 1e-6))
    raw = [coef[0] if x else coef[1] for x in labels]
    scale = len(raw) / sum(raw)
    return [c * scale for c in raw], counts


_FINAL_RX = compile_pattern(FINAL_PATTERN, "FINAL_PATTERN")
_STEP_RX = compile_pattern(STEP_VERDICT_PATTERN, "STEP_VERDICT_PATTERN")


@GROUP_STAGES.register
class TangoVerifier(CoTrained):
    """RL Tango (module doc): the verifier judges every solution step by step; the generator is paid α_t·(±1/n) at
    the step ends (``batch.extras["token_rewards"]``; a REINFORCE++ or GAE estimator); the verifier is trained by
    GRPO on ``num_verifications`` verifications of ``solutions_per_group`` solutions per group, rewarded by the
    outcome only.

    ``verifier_model``: ``initial`` (a copy of the initial policy, with the policy's tokenizer) or a model config (a
    causal LM, loaded frozen once and copied: the copy trains, the loaded model is the KL anchor). With ``initial``
    the KL anchor is the trainer's frozen reference (the initial policy): the stage asks for one when ``kl_coef`` > 0.
    ``split``, ``tag_pattern``, ``max_steps``: the solution's steps (``split_steps``; steps past ``max_steps`` merge
    into the last). ``inference_verifications``: verifications of each other solution (their mean step rewards pay
    the generator; a training solution's K pay it too). ``alpha_start``, ``alpha_min``, ``alpha_schedule``,
    ``exp_target_frac``: α_t over the run's ``trainer.max_steps``; ``warmup_steps``: steps that pay no step rewards;
    ``update_every``: the verifier trains every that many steps. ``correctness_weight``, ``format_weight``,
    ``reweight``, ``label_ema_decay``: the verifier's reward. ``template`` ({problem}, {solution}, {steps}: the
    verification prompt, a user turn), ``reply_prefix`` (text the verification starts with, in the prompt, not
    sampled: read as part of the reply; a small verifier starts in the format), ``temperature``, ``top_p``,
    ``max_new_tokens`` (null: twice the run's ``trainer.max_new_tokens``, the release's 4096 for 2048): its
    sampling. ``lr``, ``clip_eps``, ``epochs``,
    ``kl_coef``, ``entropy_coef``, ``batch_size`` (sequences per forward): its update. ``name``: a reward column at
    weight 0 holding each solution's mean summed step reward (logged, not paid twice).

    Metrics: ``tango/verifier_accuracy`` (verifications whose final verdict matches the rule outcome),
    ``tango/verdict_parse_failures`` (verifications without a final verdict), ``tango/step_alignment`` (judged as
    many steps as the solution has), ``tango/verifier_loss``, ``tango/verifier_reward_mean``,
    ``tango/verifier_format_mean``, ``tango/verifier_grad_norm``, ``tango/verifier_updates``, ``tango/verifier_kl``,
    ``tango/verifier_entropy``, ``tango/alpha``, ``tango/step_reward_mean``, ``tango/rows_with_step_rewards``,
    ``tango/verifications``, ``tango/pos_coef``, ``tango/neg_coef``, ``time/tango_s``."""

    who = "TangoVerifier"

    def __init__(
        self,
        verifier_model="initial",
        label_term: str = "accuracy",
        correct_min: float = 1.0,
        name: str = "tango_process",
        split: str = "lines",
        tag_pattern: str | None = None,
        max_steps: int = 16,
        num_verifications: int = 4,
        solutions_per_group: int | None = 1,
        inference_verifications: int = 1,
        alpha_start: float = 0.5,
        alpha_min: float = 1e-3,
        alpha_schedule: str = "exp",
        exp_target_frac: float = 1.0,
        warmup_steps: int = 0,
        update_every: int = 1,
        correctness_weight: float = 1.0,
        format_weight: float = 0.8,
        reweight: str = "sqrt_inverse",
        label_ema_decay: float = 0.8,
        template: str = VERIFIER_TEMPLATE,
        reply_prefix: str = "",
        temperature: float = 1.0,
        top_p: float = 1.0,
        max_new_tokens: int | None = None,
        batch_size: int = 8,
        lr: float = 1e-6,
        weight_decay: float = 0.01,
        betas: Sequence[float] = (0.9, 0.999),
        max_grad_norm: float | None = 1.0,
        clip_eps: float = 0.2,
        epochs: int = 1,
        kl_coef: float = 0.001,
        entropy_coef: float = 0.001,
        question_key: str = "question",
        seed: int = 0,
    ):
        super().__init__(lr, weight_decay, betas, max_grad_norm)
        where = "algorithm.group_stages: TangoVerifier"
        if not (verifier_model == "initial" or not isinstance(verifier_model, str)):
            raise ValueError(f"{where}.verifier_model={verifier_model!r}: 'initial' or a model config")
        if split not in SPLIT_MODES:
            raise ValueError(f"{where}.split={split!r} is not one of {list(SPLIT_MODES)}")
        if tag_pattern is not None:
            try:
                re.compile(tag_pattern)
            except re.error as e:
                raise ValueError(f"{where}.tag_pattern={tag_pattern!r}: {e}") from e
        ints = {
            "max_steps": (max_steps, 1),
            "num_verifications": (num_verifications, 1),
            "inference_verifications": (inference_verifications, 0),
            "warmup_steps": (warmup_steps, 0),
            "update_every": (update_every, 1),
            "batch_size": (batch_size, 1),
            "epochs": (epochs, 1),
        }
        for key, (value, low) in ints.items():
            if not isinstance(value, int) or value < low:
                raise ValueError(f"{where}.{key}={value!r} must be an integer >= {low}")
        if solutions_per_group is not None and (not isinstance(solutions_per_group, int) or solutions_per_group < 1):
            raise ValueError(f"{where}.solutions_per_group={solutions_per_group!r}: an integer >= 1, or null (all)")
        if alpha_schedule not in SCHEDULES:
            raise ValueError(f"{where}.alpha_schedule={alpha_schedule!r} is not one of {list(SCHEDULES)}")
        if not (0 < alpha_min <= alpha_start <= 1):
            raise ValueError(f"{where}: need 0 < alpha_min ({alpha_min}) <= alpha_start ({alpha_start}) <= 1")
        if not exp_target_frac > 0:
            raise ValueError(f"{where}.exp_target_frac={exp_target_frac} must be > 0")
        if reweight not in REWEIGHTS:
            raise ValueError(f"{where}.reweight={reweight!r} is not one of {list(REWEIGHTS)}")
        if not 0.0 <= label_ema_decay < 1.0:
            raise ValueError(f"{where}.label_ema_decay={label_ema_decay} must be in [0, 1)")
        if not (temperature > 0 and 0 < top_p <= 1):
            raise ValueError(f"{where}: temperature ({temperature}) must be > 0 and top_p ({top_p}) in (0, 1]")
        if max_new_tokens is not None and (not isinstance(max_new_tokens, int) or max_new_tokens < 1):
            raise ValueError(f"{where}.max_new_tokens={max_new_tokens!r}: an integer >= 1, or null")
        if not 0 < clip_eps < 1:
            raise ValueError(f"{where}.clip_eps={clip_eps} must be in (0, 1)")
        if kl_coef < 0 or entropy_coef < 0:
            raise ValueError(f"{where}: kl_coef ({kl_coef}) and entropy_coef ({entropy_coef}) must be >= 0")
        missing = [f for f in ("problem", "solution", "steps") if "{" + f + "}" not in template]
        if missing:
            raise ValueError(f"{where}.template lacks {', '.join('{' + f + '}' for f in missing)}")
        try:
            template.format(problem="p", solution="s", steps=1)
        except (KeyError, IndexError, ValueError) as e:
            raise ValueError(f"{where}.template has a field other than problem, solution, steps ({e!r})") from e
        if not name:
            raise ValueError(f"{where}.name is empty: the step rewards' log column needs a name")
        self.verifier_model, self.label_term, self.correct_min = verifier_model, label_term, float(correct_min)
        self.name, self.split, self.tag_pattern, self.max_steps = name, split, tag_pattern, max_steps
        self.num_verifications, self.solutions_per_group = num_verifications, solutions_per_group
        self.inference_verifications = inference_verifications
        self.alpha_start, self.alpha_min = float(alpha_start), float(alpha_min)
        self.alpha_schedule, self.exp_target_frac = alpha_schedule, float(exp_target_frac)
        self.warmup_steps, self.update_every = warmup_steps, update_every
        self.correctness_weight, self.format_weight = float(correctness_weight), float(format_weight)
        self.reweight, self.label_ema_decay = reweight, float(label_ema_decay)
        self.template, self.temperature, self.top_p = template, float(temperature), float(top_p)
        self.reply_prefix = str(reply_prefix or "")
        self.max_new_tokens, self.batch_size = max_new_tokens, batch_size
        self.clip_eps, self.epochs = float(clip_eps), epochs
        self.kl_coef, self.entropy_coef = float(kl_coef), float(entropy_coef)
        self.question_key, self.seed = question_key, int(seed)
        self.label_counts: tuple[float, float] | None = None  # EMA of the (correct, wrong) outcome counts
        self.anchor = None  # the loaded frozen verifier (a model config): the KL anchor

    @property
    def needs_reference(self) -> bool:
        """The KL anchor of an ``initial`` verifier is the trainer's frozen reference (the initial policy)."""
        return self.kl_coef > 0 and self.verifier_model == "initial"

    # the model and its state ---------------------------------------------------------------------------------------
    def make_model(self, ctx):
        if self.verifier_model == "initial":
            policy = _unwrap(ctx.policy)
            _refuse_peft(policy, self.who)
            model = copy.deepcopy(policy)
            for p in model.parameters():
                p.grad = None
            return model, ctx.tokenizer
        from rlexp.rewards.factuality import load_scorer

        device = str(next(ctx.policy.parameters()).device)
        loaded, tok = load_scorer(self.verifier_model, device)
        self.anchor = loaded
        return copy.deepcopy(loaded), tok

    def extra_state(self) -> dict:
        return {"label_counts": self.label_counts}

    def load_extra_state(self, state: dict) -> None:
        counts = state.get("label_counts")
        self.label_counts = None if counts is None else (float(counts[0]), float(counts[1]))

    def kl_anchor(self, ctx):
        if self.kl_coef == 0:
            return None
        if self.anchor is not None:
            return self.anchor
        ref = getattr(ctx, "reference", None)
        if ref is None or getattr(ref, "model", None) is None or getattr(ref, "kind", "frozen") != "frozen":
            raise ValueError(
                "algorithm.group_stages: TangoVerifier.kl_coef > 0 anchors the verifier to the initial policy, the "
                "trainer's frozen reference: set algorithm.reference.kind=frozen, or kl_coef=0"
            )
        if getattr(ref, "reincarnated", False):
            raise ValueError("TangoVerifier: the reference was reset (algorithm.reincarnate_at): set kl_coef=0")
        return ref.model

    # the steps and the prompts -------------------------------------------------------------------------------------
    def spans(self, completion: str) -> list[tuple[int, int]]:
        spans = split_steps(completion, self.split, self.tag_pattern)
        if len(spans) > self.max_steps:
            spans = [*spans[: self.max_steps - 1], (spans[self.max_steps - 1][0], spans[-1][1])]
        return spans

    def prompt(self, problem: str, steps: list[str]) -> str:
        solution = "\n".join(f"Step {k + 1}: {s}" for k, s in enumerate(steps)) if steps else "(empty)"
        text = self.template.format(problem=problem.strip(), solution=solution, steps=len(steps))
        tok = self.tokenizer
        if getattr(tok, "chat_template", None):
            text = tok.apply_chat_template(
                [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False
            )
        return text + self.reply_prefix

    def alpha(self, step: int, max_steps: int) -> float:
        total = max_steps - self.warmup_steps
        return alpha_at(
            step - 1 - self.warmup_steps, total, self.alpha_start, self.alpha_min, self.alpha_schedule,
            self.exp_target_frac,
        )  # fmt: skip

    # sampling ------------------------------------------------------------------------------------------------------
    @torch.no_grad()
    def sample(self, prompts: list[str], counts: list[int], ctx, step: int) -> list[dict]:
        """``counts[j]`` verifications of prompt j, sampled by the verifier on a forked random stream (seeded by
        the stage's seed and the step): dicts with the prompt index ``j``, ``prompt`` and ``completion`` token id
        lists (the completion up to and including its end token) and ``text``."""
        from rlexp.core.masks import completion_mask_from_ids

        tok, model = self.tokenizer, self.model
        device = next(model.parameters()).device
        rows = [j for j, k in enumerate(counts) for _ in range(k)]
        if not rows:
            return []
        limit = self.max_new_tokens or max(16, 2 * int(stage_setting(ctx, "max_new_tokens", 64)))
        eos = model.generation_config.eos_token_id
        eos_ids = list(eos) if isinstance(eos, (list, tuple)) else [eos if eos is not None else tok.eos_token_id]
        pad = tok.pad_token_id if tok.pad_token_id is not None else eos_ids[0]
        cuda = (
            [device.index if device.index is not None else torch.cuda.current_device()] if device.type == "cuda" else []
        )
        side = tok.padding_side
        tok.padding_side = "left"
        model.eval()
        out = []
        try:
            with torch.random.fork_rng(devices=cuda), _autocast(ctx, device):
                for c, k in enumerate(range(0, len(rows), self.batch_size)):
                    chunk = rows[k : k + self.batch_size]
                    enc = tok([prompts[j] for j in chunk], return_tensors="pt", padding=True, add_special_tokens=False)
                    enc = enc.to(device)
                    torch.manual_seed(self.seed * 1_000_003 + step * 10_007 + c)
                    ids = model.generate(
                        **enc,
                        do_sample=True,
                        temperature=self.temperature,
                        top_p=self.top_p,
                        top_k=0,
                        max_new_tokens=limit,
                        pad_token_id=pad,
                        eos_token_id=eos_ids,
                    )
                    width = enc["input_ids"].shape[1]
                    completion = ids[:, width:]
                    mask, _ = completion_mask_from_ids(completion, eos_ids)
                    for r, j in enumerate(chunk):
                        p = enc["input_ids"][r][enc["attention_mask"][r].bool()].tolist()
                        cids = completion[r][mask[r].bool()].tolist()
                        out.append(
                            {
                                "j": j,
                                "prompt": p,
                                "completion": cids,
                                "text": self.reply_prefix + tok.decode(cids, skip_special_tokens=True),
                            }
                        )
        finally:
            tok.padding_side = side
        return out

    # the stage ------------------------------------------------------------------------------------------------------
    def __call__(self, batch: RolloutBatch, ctx) -> RolloutBatch:
        if len(batch) == 0:
            return batch
        t0 = time.perf_counter()
        correct = _rule_correct(batch, self.label_term, self.correct_min, self.who)
        self.build(ctx)
        step = int(getattr(ctx, "step", 1) or 1)
        alpha = self.alpha(step, int(stage_setting(ctx, "max_steps", step)))
        train = (step - 1) % self.update_every == 0
        anchor = self.kl_anchor(ctx) if train else None  # a missing anchor is a configuration error: before sampling
        n = len(batch)
        spans = [self.spans(c) for c in batch.completions]
        steps_text = [[batch.completions[i][a:b] for a, b in spans[i]] for i in range(n)]
        # training solutions: the first ``solutions_per_group`` rows of each group
        chosen: set[int] = set()
        if train:
            seen: dict[int, int] = {}
            for i, g in enumerate(batch.group_ids.tolist()):
                seen[g] = seen.get(g, 0) + 1
                if self.solutions_per_group is None or seen[g] <= self.solutions_per_group:
                    chosen.add(i)
        paying = alpha > 0
        counts = [
            self.num_verifications if i in chosen else (self.inference_verifications if paying else 0) for i in range(n)
        ]
        prompts = [
            self.prompt(_question(batch, i, self.question_key), steps_text[i]) if counts[i] else "" for i in range(n)
        ]
        samples = self.sample(prompts, counts, ctx, step)
        t_sample = time.perf_counter() - t0
        per_row: dict[int, list[dict]] = {}
        for s in samples:
            final, verdicts = parse_verification(s["text"])
            s["final"], s["steps"] = final, step_rewards(verdicts, len(spans[s["j"]]))
            s["format"] = verifier_format_score(s["text"], len(spans[s["j"]]))
            s["reward"] = verifier_reward(
                final, correct[s["j"]], s["format"], self.correctness_weight, self.format_weight
            )
            per_row.setdefault(s["j"], []).append(s)
        column, paid = self.pay(batch, spans, per_row, alpha, ctx.tokenizer)
        batch = append_reward_column(batch, self.name, torch.tensor(column), 0.0)
        stats = self.update([s for s in samples if s["j"] in chosen], correct, anchor, ctx) if chosen else {}
        finals = [s["final"] for s in samples]
        stats.update(
            {
                "tango/alpha": alpha,
                "tango/verifications": float(len(samples)),
                "tango/verifier_accuracy": (
                    sum(f is not None and (f >= 0.5) == correct[s["j"]] for f, s in zip(finals, samples)) / len(samples)
                    if samples
                    else 0.0
                ),
                "tango/verdict_parse_failures": float(sum(f is None for f in finals)),
                "tango/step_alignment": sum(s["steps"] is not None for s in samples) / len(samples) if samples else 0.0,
                "tango/verifier_format_mean": sum(s["format"] for s in samples) / len(samples) if samples else 0.0,
                "tango/step_reward_mean": sum(column) / n,
                "tango/rows_with_step_rewards": paid / n,
                "tango/verifier_updates": float(self.updates),
                "time/tango_sample_s": t_sample,
                "time/tango_s": time.perf_counter() - t0,
            }
        )
        batch.stats.update(stats)
        return batch

    def pay(
        self, batch: RolloutBatch, spans, per_row: dict[int, list[dict]], alpha: float, policy_tokenizer
    ) -> tuple[list[float], int]:
        """α·(the mean over the row's verifications of ±1/n) at each step's last token, added to
        ``batch.extras["token_rewards"]``; each row's mean summed step reward (the log column) and the number of rows
        paid."""
        n, width = batch.completion_ids.shape
        extra = torch.zeros(n, width, dtype=torch.float32)
        column, paid = [0.0] * n, 0
        for i, samples in per_row.items():
            if not spans[i]:
                continue
            mean = [0.0] * len(spans[i])
            for s in samples:  # a verification that judged other steps counts as 0 (the release's mean)
                for k, r in enumerate(s["steps"] or []):
                    mean[k] += r / len(samples)
            if not any(mean):
                continue
            column[i] = sum(mean)
            if alpha <= 0:
                continue
            valid = int(batch.completion_mask[i].sum())
            ids = batch.completion_ids[i, :valid].tolist()
            ends = [b for _, b in spans[i]]
            try:
                positions = token_positions(policy_tokenizer, ids, batch.completions[i], ends)
            except Exception as e:  # a row whose steps cannot be placed is not paid; the run goes on
                log.warning("TangoVerifier could not place step rewards on a row: %r", e)
                continue
            for t, r in zip(positions, mean):
                extra[i, max(0, min(int(t), valid - 1))] += alpha * r
            paid += 1
        if paid:
            prev = batch.extras.get(TOKEN_REWARDS)
            extra = extra.to(batch.completion_ids.device)
            batch.extras[TOKEN_REWARDS] = extra if prev is None else prev.float() + extra
        return column, paid

    def update(self, samples: list[dict], correct: list[bool], anchor, ctx) -> dict:
        """GRPO on the training verifications: advantages over each solution's K, the class weights, ``epochs``
        optimiser steps of the clipped loss (token mean over all of them) − entropy bonus + k3 KL to ``anchor``."""
        if not samples:
            return {}
        rewards = torch.tensor([s["reward"] for s in samples], dtype=torch.float32)
        owner = torch.tensor([s["j"] for s in samples])
        mean, std, count = group_stats(rewards, owner)
        adv = torch.where(count > 1, (rewards - mean) / (std + 1e-6), torch.zeros_like(rewards))
        coefs, self.label_counts = class_coefficients(
            [correct[s["j"]] for s in samples], self.label_counts, self.label_ema_decay, self.reweight
        )
        weighted = adv * torch.tensor(coefs)
        device = next(self.model.parameters()).device
        tokens = sum(max(1, len(s["completion"])) for s in samples)
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        chunks = [
            list(range(k, min(k + self.batch_size, len(samples)))) for k in range(0, len(samples), self.batch_size)
        ]
        olds: dict[int, torch.Tensor] = {}
        self.model.train()
        losses, norms, kls, ents = [], [], [], []
        for _ in range(self.epochs):
            total, kl_sum, ent_sum = 0.0, 0.0, 0.0
            for c, idx in enumerate(chunks):
                p_ids, p_mask, c_ids, c_mask = _pad([samples[i] for i in idx], pad, device)
                logp, ent = token_logprobs(
                    self.model, p_ids, p_mask, c_ids, c_mask, temperature=self.temperature,
                    with_entropy=self.entropy_coef > 0, autocast_dtype=getattr(ctx, "autocast_dtype", None),
                    entropy_grad=self.entropy_coef > 0,
                )  # fmt: skip
                if c not in olds:
                    olds[c] = logp.detach()
                mask = c_mask.float()
                per = ppo_clip(logp, olds[c], weighted[idx].to(device), mask, self.clip_eps, self.clip_eps).per_token
                loss = (per * mask).sum() / tokens
                if self.entropy_coef > 0:
                    e = (ent * mask).sum() / tokens
                    loss = loss - self.entropy_coef * e
                    ent_sum += float(e.detach())
                if anchor is not None:
                    with torch.no_grad():
                        ref, _ = token_logprobs(
                            anchor, p_ids, p_mask, c_ids, c_mask, temperature=self.temperature,
                            autocast_dtype=getattr(ctx, "autocast_dtype", None),
                        )  # fmt: skip
                    k = (kl_estimate(logp, ref, "k3", clamp=True) * mask).sum() / tokens
                    loss = loss + self.kl_coef * k
                    kl_sum += float(k.detach())
                loss.backward()
                total += float(loss.detach())
            losses.append(total)
            kls.append(kl_sum)
            ents.append(ent_sum)
            norms.append(self.optimizer_step())
        self.model.eval()
        pos_coef = next((c for c, s in zip(coefs, samples) if correct[s["j"]]), 0.0)
        neg_coef = next((c for c, s in zip(coefs, samples) if not correct[s["j"]]), 0.0)
        return {
            "tango/verifier_loss": losses[0],
            "tango/verifier_reward_mean": float(rewards.mean()),
            "tango/verifier_grad_norm": norms[-1],
            "tango/verifier_kl": kls[-1],
            "tango/verifier_entropy": ents[0],
            "tango/verifier_adv_abs_mean": float(adv.abs().mean()),
            "tango/pos_coef": pos_coef,
            "tango/neg_coef": neg_coef,
        }


def _pad(samples: list[dict], pad: int, device) -> tuple[torch.Tensor, ...]:
    """(prompt ids, prompt mask) left-padded and (completion ids, completion mask) right-padded, of ``samples``."""
    P = max(len(s["prompt"]) for s in samples)
    T = max(1, max(len(s["completion"]) for s in samples))
    p_ids = torch.full((len(samples), P), pad, dtype=torch.long)
    p_mask = torch.zeros(len(samples), P, dtype=torch.long)
    c_ids = torch.full((len(samples), T), pad, dtype=torch.long)
    c_mask = torch.zeros(len(samples), T, dtype=torch.long)
    for r, s in enumerate(samples):
        p, c = s["prompt"], s["completion"]
        p_ids[r, P - len(p) :] = torch.tensor(p, dtype=torch.long)
        p_mask[r, P - len(p) :] = 1
        if c:
            c_ids[r, : len(c)] = torch.tensor(c, dtype=torch.long)
            c_mask[r, : len(c)] = 1
    return p_ids.to(device), p_mask.to(device), c_ids.to(device), c_mask.to(device)
