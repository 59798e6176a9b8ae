"""Structured-config schema of the train app (type-checked by OmegaConf at compose time) and the
range checks that run before anything is loaded, each naming the offending key."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf

CORRECTION_MODES = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask", "sequence_reject")


@dataclass
class TrainerConfig:
    max_steps: int = 30
    prompts_per_step: int = 8  # distinct prompts per step (groups)
    num_generations: int = 4  # G, completions per prompt
    # μ, optimiser passes (epochs) over one rollout batch; null: the method's (algorithm.num_iterations, 1 for most)
    num_iterations: Optional[int] = None
    # k, optimiser steps per epoch, one per mini-batch of whole groups (TRL's steps_per_generation, verl's
    # train batch / ppo_mini_batch_size); null: the method's schedule (algorithm.steps_per_rollout)
    steps_per_rollout: Optional[int] = None
    micro_batch_size: int = 16  # completions per forward/backward (gradient accumulation = N / this)
    # and at most this many padded positions per forward/backward (rows × (prompt + completion window)):
    # short rows then train in larger micro-batches, long ones in smaller (null: rows only)
    micro_batch_tokens: Optional[int] = None
    max_new_tokens: int = 64
    # tokens a prompt may have (chat template included; TRL's max_prompt_length); null: the model's context
    # (max_position_embeddings) minus max_new_tokens, which is also the most it may be set to
    max_prompt_length: Optional[int] = None
    # a training prompt longer than that: error (refused at the first step, naming the row, before anything is
    # generated) | truncate (the question's first tokens are cut, the chat template kept) | drop (left out)
    overlong_prompts: str = "error"
    temperature: float = 1.0
    # μ·k > 1: the old log-probs from a no-grad forward of the policy before the update (TRL, verl) instead of
    # the sampler's recorded ones (null: recompute whenever μ·k > 1 or trainer.async_rollout)
    recompute_old_logprobs: Optional[bool] = None
    # one-step-off-policy (Asynchronous RLHF, Noukhovitch et al. 2025; verl's one_step_off_policy recipe, OpenRLHF's
    # --async_train): step t+1's rollout is generated in a thread of its own, by the weights step t starts from,
    # while step t trains (rlexp/trainer/async_rollout.py). Needs rollout=hf with engine=loop
    async_rollout: bool = False
    # CPU torch threads of the rollout thread (the trainer thread keeps the rest while a rollout is in flight);
    # null: half of trainer.num_threads (torch's count), at least 1
    async_rollout_threads: Optional[int] = None
    # train-inference mismatch correction (rlexp/algorithms/regularisers/rollout_correction.py): null, token_truncate,
    # token_mask, sequence_truncate, sequence_mask, sequence_reject; the threshold C (implies recomputed old log-probs)
    rollout_correction: Optional[str] = None
    rollout_correction_threshold: float = 2.0
    max_grad_norm: Optional[float] = 1.0
    warmup_steps: int = 0
    eval_every: int = 0  # 0: evaluate only at the end (if eval.size > 0)
    # with eval.size > 0: evaluate the untrained policy too, logged at step 0 (the summary's "before")
    eval_at_start: bool = True
    checkpoint_every: int = 10
    # checkpoints kept in <run_dir>/checkpoints once the run finishes: the newest N (`last`, then `step-<N>`);
    # 0: none (while the run trains one is kept, so a killed run resumes)
    keep_checkpoints: int = 1
    # while the run trains, keep the checkpoint before the newest too: a resume falls back to it when the newest
    # fails verification (truncated, altered); dropped when the run finishes (one checkpoint more on disk meanwhile)
    fallback_checkpoint: bool = True
    save_optimizer: bool = True  # AdamW's moments in checkpoints (~2/3 of the size; needed to resume exactly)
    seed: int = 0
    # continue from <run_dir>/checkpoints if present; false in a directory that holds a run is refused
    resume: bool = True
    # SIGTERM/SIGINT: the current step may finish within this many seconds, then the run checkpoints and stops
    # (KILLED, resumable); past it, or on a second signal, it stops at once (null: wait for the step)
    stop_grace_s: Optional[float] = 20.0
    run_dir: str = "${hydra:runtime.output_dir}"
    progress: bool = True
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    num_threads: int = 0  # torch CPU threads; 0 = torch's default
    accuracy_term: Optional[str] = "accuracy"
    # the G completions of a prompt share one prompt forward (KV reuse); null: yes on the CPU (compute-
    # bound: train 4.5 vs 5.9-7.4 s), no on CUDA (a small model's step is launch-bound there and the
    # shared path dispatches 2.1x the ops: two forwards, cache repeat; benchmarks/op_count.py --cuda-chunks)
    share_prompt_forward: Optional[bool] = None
    autocast: str = "auto"  # auto (bf16 on GPU and on CPUs with bf16 matmul units) | bf16 | fp16 | off
    cpu_matmul_attention: bool = True  # CPU training forward/backward: matmul attention, not SDPA (slow CPU backward)
    # torch.compile the policy's training forward (its backward too, through AOTAutograd): Inductor fuses
    # each layer's ~60 small ops, which is what a small model's GPU training step is bound by. Compiled
    # for dynamic shapes on the first micro-batch (SmolLM2 on the 2-core CPU: ~3 min); with
    # share_prompt_forward null the compiled forward is one per row.
    compile: bool = False
    compile_backend: str = "inductor"  # torch.compile backend ("eager": dynamo tracing only, for debugging)
    compile_mode: Optional[str] = None  # torch.compile mode (null: default; "max-autotune-no-cudagraphs", …)


@dataclass
class EvalConfig:
    size: int = 50  # held-out prompts evaluated greedily during training (0: off)
    max_new_tokens: Optional[int] = None
    # paraphrase consistency (rlexp/evaluation/paraphrase.py): each held-out question (each benchmark problem) asked
    # again in this many other wordings; logs paraphrase/accuracy and paraphrase/agreement (0: off)
    paraphrases: int = 0
    paraphrase_source: str = "template"  # template (offline rule-based rewordings) | record (the dataset's own)
    # held-out accuracy per distribution too (eval/accuracy/<distribution>): a record key such as source_dataset (a
    # mixture's task) or difficulty, or a list of keys (rlexp.samplers.feedback.distribution_of); null: off
    by: Any = None
    # benchmark evaluation (`rlexp eval`, and training with `+benchmark=<entry>`); see
    # rlexp/evaluation/runner.py. pass@k is logged as pass_at_k, maj@k as maj_at_k (MLflow-safe).
    n: int = 1  # samples per problem
    ks: Optional[list[int]] = None  # pass@k for these k <= n (null: every k in 1..n); a k > n is refused
    maj_ks: Optional[list[int]] = None  # maj@k for these k <= n (null: k = n); a k > n is refused
    maj_tie: str = "random"  # random (expected value over tied answers) | first (verl's rule)
    maj_missing: str = "abstain"  # maj@k: a missing answer abstains | vote: counts as a (wrong) vote (verl)
    max_subsets: int = 2000  # maj@k: exact average over k-subsets up to this many, else sampled
    greedy: Optional[bool] = None  # null: greedy iff n == 1
    temperature: Optional[float] = None  # sampling temperature (null: the rollout's / trainer.temperature)
    limit: Optional[int] = None  # problems per benchmark (null: all)
    batch_problems: int = 8  # problems per generate call
    bootstrap: int = 1000  # bootstrap resamples for the pass@1 CI (0: off)
    ci_level: float = 0.95
    write_samples: bool = True  # per-problem JSONL next to summary.json
    checkpoint: Optional[str] = None  # `rlexp eval`: a run dir, its checkpoints/last, or a model dir
    step: Optional[int] = None  # `rlexp eval`: tracker step (null: the checkpoint's step, else 0)


@dataclass
class ConsistencyConfig:
    """Consistency rate (rlexp/evaluation/consistency.py): per training step when enabled, and in
    `rlexp eval` for every benchmark with a final answer."""

    enabled: bool = False
    rederive: bool = True  # cut the stated answer, let the judge finish greedily, compare
    likelihood: bool = True  # judge's probability of the stated answer given the reasoning
    shuffle: bool = False  # multiple-choice rows: re-ask with the options moved, same reasoning, same option? (ACRE)
    judge: str = "reference"  # reference (frozen initial / base model) | policy
    threshold: float = 0.5  # likelihood_rate = share of completions above this
    max_new_tokens: int = 16  # tokens the judge may write to re-derive the answer
    max_completions: Optional[int] = None  # measure only the first N completions (cost)
    batch_size: int = 16


@dataclass
class TrialConfig:
    """Set by the Optuna sweeper (``hydra/sweeper=rlexp_optuna``) on each job it launches: the study
    this run is a trial of (it reports its metric there and may be pruned). Null outside sweeps."""

    storage: Optional[str] = None  # Optuna storage URL (resolved, absolute)
    study: Optional[str] = None
    number: Optional[int] = None


@dataclass
class RLExpConfig:
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    consistency: ConsistencyConfig = field(default_factory=ConsistencyConfig)
    benchmark: Any = None  # benchmark entries evaluated during training (`+benchmark=offline`)
    model: Any = MISSING
    dataset: Any = MISSING
    view: Any = None  # a view of the dataset's records (conf/view; view=multiple_choice), null: as they are
    prompt: Any = MISSING
    reward: Any = MISSING
    algorithm: Any = MISSING
    rollout: Any = MISSING
    tracker: Any = MISSING
    optimizer: Any = MISSING
    sampler: Any = None  # which prompts each step draws (conf/sampler; null: shuffle)
    # data parallelism under accelerate launch / torchrun (conf/distributed; rlexp/trainer/distributed.py); null or
    # distributed=none: one process
    distributed: Any = None
    environment: Any = None  # multi-turn episodes' environment (conf/environment; with rollout=multi_turn)
    tools: Any = None  # the tools of environment=tool_use (conf/tools; a list selection: tools=[python,calculator])
    run_name: Optional[str] = None
    experiment_name: str = (
        "rlexp"  # MLflow experiment / W&B project (conf/experiment/ is the group of experiment files)
    )
    trial: TrialConfig = field(default_factory=TrialConfig)
    # an experiment file's `rlexp reproduce` spec (rlexp/reproduce/spec.py): read by that command, ignored by training
    reproduce: Any = None
    # an experiment file's stages (`rlexp pipeline`, rlexp/runs/pipeline.py): read by that command, ignored by training
    pipeline: Any = None


@dataclass
class EvalAppConfig:
    """Schema of `rlexp eval` (conf/eval.yaml). ``trainer`` holds the run settings that the shared
    rollout and tracker groups read (max_new_tokens, temperature, run_dir) plus seed and device."""

    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    consistency: ConsistencyConfig = field(default_factory=ConsistencyConfig)
    benchmark: Any = MISSING
    model: Any = MISSING
    prompt: Any = MISSING
    rollout: Any = MISSING
    tracker: Any = MISSING
    run_name: Optional[str] = None
    experiment_name: str = "rlexp"


def register() -> None:
    ConfigStore.instance().store(name="rlexp_schema", node=RLExpConfig)
    ConfigStore.instance().store(name="rlexp_eval_schema", node=EvalAppConfig)


class ConfigError(ValueError):
    """A configuration value is invalid; the message names the key."""


OVERLONG_PROMPTS = ("error", "truncate", "drop")


def validate(cfg: DictConfig) -> None:
    """The train app's checks, before anything is built: no key the schema does not know under the nodes it types,
    every range, the device, the eval k values, the reward terms."""
    check_unknown_keys(cfg)
    t = cfg.trainer
    checks = [
        (t.num_generations >= 2, "trainer.num_generations", t.num_generations, "must be >= 2 (a group needs peers)"),
        (t.prompts_per_step >= 1, "trainer.prompts_per_step", t.prompts_per_step, "must be >= 1"),
        (t.max_steps >= 1, "trainer.max_steps", t.max_steps, "must be >= 1"),
        (
            t.num_iterations is None or t.num_iterations >= 1,
            "trainer.num_iterations",
            t.num_iterations,
            "must be >= 1 or null",
        ),
        (
            t.steps_per_rollout is None or 1 <= t.steps_per_rollout <= t.prompts_per_step,
            "trainer.steps_per_rollout",
            t.steps_per_rollout,
            f"must be in [1, trainer.prompts_per_step={t.prompts_per_step}] (a mini-batch holds whole groups) or null",
        ),
        (t.micro_batch_size >= 0, "trainer.micro_batch_size", t.micro_batch_size, "must be >= 0 (0: whole batch)"),
        (
            t.micro_batch_tokens is None or t.micro_batch_tokens > 0,
            "trainer.micro_batch_tokens",
            t.micro_batch_tokens,
            "must be > 0 or null (no token budget)",
        ),
        (t.max_new_tokens > 0, "trainer.max_new_tokens", t.max_new_tokens, "must be > 0"),
        (
            t.max_prompt_length is None or t.max_prompt_length > 0,
            "trainer.max_prompt_length",
            t.max_prompt_length,
            "must be > 0 or null (the model's context minus trainer.max_new_tokens)",
        ),
        (
            t.overlong_prompts in OVERLONG_PROMPTS,
            "trainer.overlong_prompts",
            t.overlong_prompts,
            f"must be one of {list(OVERLONG_PROMPTS)}",
        ),
        (
            t.rollout_correction in (None, *CORRECTION_MODES),
            "trainer.rollout_correction",
            t.rollout_correction,
            f"must be null or one of {list(CORRECTION_MODES)}",
        ),
        (
            t.rollout_correction_threshold > 1
            or (t.rollout_correction_threshold > 0 and t.rollout_correction != "sequence_reject"),
            "trainer.rollout_correction_threshold",
            t.rollout_correction_threshold,
            "must be > 0 (> 1 for sequence_reject)",
        ),
        (t.temperature > 0, "trainer.temperature", t.temperature, "must be > 0"),
        (t.eval_every >= 0, "trainer.eval_every", t.eval_every, "must be >= 0"),
        (t.checkpoint_every >= 0, "trainer.checkpoint_every", t.checkpoint_every, "must be >= 0"),
        (t.keep_checkpoints >= 0, "trainer.keep_checkpoints", t.keep_checkpoints, "must be >= 0"),
        (t.warmup_steps >= 0, "trainer.warmup_steps", t.warmup_steps, "must be >= 0"),
        (
            t.async_rollout_threads is None or t.async_rollout_threads >= 1,
            "trainer.async_rollout_threads",
            t.async_rollout_threads,
            "must be >= 1 or null (half the trainer's threads)",
        ),
    ]
    lr = cfg.optimizer.get("lr")
    checks.append((lr is not None and lr > 0, "optimizer.lr", lr, "must be > 0"))
    for ok, key, value, why in checks:
        if not ok:
            raise ConfigError(f"{key}={value}: {why}")
    check_device(t.device)
    peft = cfg.model.get("peft")
    if peft is not None:
        from rlexp.models.peft import check_peft_config

        try:
            check_peft_config(OmegaConf.to_container(peft, resolve=True) if peft else None)
        except ValueError as e:
            raise ConfigError(str(e)) from None
    merge = cfg.model.get("merge")
    if merge is not None:  # model.merge (rlexp.models.merging): each step's `with` and `weight`
        from rlexp.models.merging import parse_merges

        try:
            parse_merges(OmegaConf.to_container(merge, resolve=True) if OmegaConf.is_config(merge) else merge)
        except ValueError as e:
            raise ConfigError(str(e)) from None
    check_eval_ks(cfg.eval.n, cfg.eval.ks, cfg.eval.maj_ks)
    check_maj(cfg.eval)
    check_algorithm(cfg.algorithm)
    if t.compile:
        _check_compile(t)
    if t.async_rollout:
        _check_async_rollout(cfg.rollout)
    _check_episodes(cfg)
    terms = cfg.reward.get("terms") or {}
    if not terms:
        raise ConfigError("reward.terms is empty: configure at least one reward term")
    for name, term in terms.items():
        if "_target_" not in term:
            raise ConfigError(f"reward.terms.{name} has no _target_")
    if t.accuracy_term is not None and t.accuracy_term not in terms:
        raise ConfigError(f"trainer.accuracy_term={t.accuracy_term!r} is not a reward term (terms: {list(terms)})")


# parts that read multi-turn episodes (turns, their spans and rewards): they need rollout=multi_turn
EPISODE_PARTS = (
    "rlexp.algorithms.advantages.turn_level.turn_level",
    "rlexp.algorithms.advantages.step_groups.gigpo",
    "rlexp.algorithms.group_stages.information_gain.InformationGain",
    "rlexp.algorithms.group_stages.progress.ProgressAttribution",
    "rlexp.algorithms.group_stages.step_search.StepSearch",
)
MULTI_TURN_ROLLOUT = "rlexp.rollout.multi_turn.MultiTurnRollout"
# parts that read SUPO's segment rows (several rows per episode): they need rollout=supo
SEGMENT_PARTS = ("rlexp.algorithms.advantages.segments.supo",)
SUMMARIZING_ROLLOUT = "rlexp.rollout.summarizing.SummarizingRollout"
# parts that read the (turn, candidate) rows of AT-GRPO's tree rollout: they need rollout=turn_groups
TURN_GROUP_PARTS = ("rlexp.algorithms.advantages.agent_turn.agent_turn_groups",)
TURN_GROUPS_ROLLOUT = "rlexp.rollout.turn_groups.TurnGroupRollout"
# ARPO's branching rollout (multi-turn episodes, some branched from others): parts that read its branch trees need it,
# and its episodes serve the episode parts as rollout=multi_turn's do
BRANCH_PARTS = ("rlexp.algorithms.advantages.branching.arpo",)
BRANCHING_ROLLOUT = "rlexp.rollout.branching.BranchingRollout"


def _check_branching(cfg: DictConfig, rollout, targets: list) -> None:
    """ARPO: its advantage reads the branching rollout's trees; the branching rollout needs an environment."""
    for target, key in targets:
        if target in BRANCH_PARTS and rollout != BRANCHING_ROLLOUT:
            raise ConfigError(
                f"{key} ({target.rsplit('.', 1)[-1]}) reads ARPO's branched episodes: run it with rollout=arpo "
                f"environment=tool_use tools=[python] prompt=python_tool (rollout is {rollout})"
            )
    if rollout == BRANCHING_ROLLOUT and cfg.get("environment") is None:
        raise ConfigError("rollout=arpo needs an environment: e.g. environment=tool_use tools=[python]")


TREE_PARTS = {
    "rlexp.algorithms.advantages.tree.treepo": "tree",
    "rlexp.algorithms.advantages.tree.treerl": "eptree",
    "rlexp.algorithms.advantages.tree.spo_tree": "spo_tree",
}
TREE_ROLLOUTS = ("rlexp.rollout.tree.SegmentTreeRollout", "rlexp.rollout.tree.EntropyTreeRollout")


def _check_trees(rollout, targets: list) -> None:
    """TreePO, TreeRL and SPO-tree: their advantages read the tree rollout's node paths."""
    for target, key in targets:
        if target in TREE_PARTS and rollout not in TREE_ROLLOUTS:
            raise ConfigError(
                f"{key} ({target.rsplit('.', 1)[-1]}) reads the tree rollout's node paths: run it with "
                f"rollout={TREE_PARTS[target]} (rollout is {rollout})"
            )


def _check_episodes(cfg: DictConfig) -> None:
    """A method whose parts read episodes refuses a single-turn rollout; a multi-turn rollout needs an environment."""
    rollout = cfg.rollout.get("_target_")
    alg = cfg.algorithm
    targets = [((alg.get("advantage") or {}).get("_target_"), "algorithm.advantage")]
    targets += [
        (st.get("_target_"), f"algorithm.group_stages.{i}") for i, st in enumerate(alg.get("group_stages") or [])
    ]
    for target, key in targets:
        if target in EPISODE_PARTS and rollout not in (MULTI_TURN_ROLLOUT, BRANCHING_ROLLOUT):
            raise ConfigError(
                f"{key} ({target.rsplit('.', 1)[-1]}) reads multi-turn episodes: run it with rollout=multi_turn "
                f"environment=tool_use tools=[python] (rollout is {rollout})"
            )
    if rollout == MULTI_TURN_ROLLOUT and cfg.get("environment") is None:
        raise ConfigError("rollout=multi_turn needs an environment: e.g. environment=tool_use tools=[python]")
    _check_branching(cfg, rollout, targets)
    _check_trees(rollout, targets)
    for target, key in targets:
        if target in SEGMENT_PARTS and rollout != SUMMARIZING_ROLLOUT:
            raise ConfigError(
                f"{key} ({target.rsplit('.', 1)[-1]}) reads SUPO's summarised segments: run it with rollout=supo "
                f"environment=tool_use tools=[python] (rollout is {rollout})"
            )
    if rollout == SUMMARIZING_ROLLOUT and cfg.get("environment") is None:
        raise ConfigError("rollout=supo needs an environment: e.g. environment=tool_use tools=[python]")
    _check_turn_groups(cfg, rollout, targets)


def _check_turn_groups(cfg: DictConfig, rollout, targets: list) -> None:
    """AT-GRPO: its advantage reads the tree rollout's rows; the tree rollout needs an environment and G = K × T."""
    for target, key in targets:
        if target in TURN_GROUP_PARTS and rollout != TURN_GROUPS_ROLLOUT:
            raise ConfigError(
                f"{key} ({target.rsplit('.', 1)[-1]}) reads turn-wise candidate groups: run it with "
                f"rollout=turn_groups environment=textworld dataset=textworld reward=text_game (rollout is {rollout})"
            )
    if rollout != TURN_GROUPS_ROLLOUT:
        return
    if cfg.get("environment") is None:
        raise ConfigError("rollout=turn_groups needs an environment: e.g. environment=textworld dataset=textworld")
    G = cfg.algorithm.get("num_generations") or cfg.trainer.num_generations
    T, K = cfg.rollout.get("max_turns", 4), cfg.rollout.get("candidates")
    if (K is not None and K < 2) or (K or G // T) < 2 or (K or G // T) * T != G:
        raise ConfigError(
            f"rollout=turn_groups: trainer.num_generations={G} must be rollout.candidates (K >= 2, got {K}) x "
            f"rollout.max_turns ({T}): one row per turn and candidate"
        )


def validate_eval(cfg: DictConfig) -> None:
    """The eval app's checks before anything loads: unknown keys, the device, the eval k values."""
    check_unknown_keys(cfg)
    check_device(cfg.trainer.device)
    check_eval_ks(cfg.eval.n, cfg.eval.ks, cfg.eval.maj_ks)
    check_maj(cfg.eval)


def check_maj(ev: DictConfig) -> None:
    for key, allowed in (("maj_tie", ("random", "first")), ("maj_missing", ("abstain", "vote"))):
        if ev.get(key, allowed[0]) not in allowed:
            raise ConfigError(f"eval.{key}={ev.get(key)!r}: must be one of {list(allowed)}")
    if ev.get("paraphrases", 0) < 0:
        raise ConfigError(f"eval.paraphrases={ev.get('paraphrases')}: must be >= 0 (0: off)")
    if ev.get("paraphrase_source", "template") not in ("template", "record"):
        raise ConfigError(
            f"eval.paraphrase_source={ev.get('paraphrase_source')!r}: must be one of ['template', 'record']"
        )


def _settings_of(target: str) -> tuple[list[str], bool] | None:
    """The keyword settings a part's ``_target_`` takes (and whether it takes any **kwargs); None when the target
    cannot be imported here (its build names the error)."""
    import inspect

    from hydra.utils import get_object

    try:
        obj = get_object(target)
        params = inspect.signature(obj).parameters.values()
    except Exception:
        return None
    names = [p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    return names, any(p.kind == p.VAR_KEYWORD for p in params)


def check_algorithm(a: DictConfig) -> None:
    """The peer-convention settings (rlexp/algorithms/CONVENTIONS.md) and the keys of the advantage and loss parts:
    a key the part's function does not take (``algorithm.loss.log_ratio_clamp`` on a loss without the clamp) is
    refused here, naming it, instead of at the first step."""
    from omegaconf import OmegaConf

    if not isinstance(a, DictConfig):
        return
    if a.get("backend") == "sft":  # stage=sft: TRL's SFTTrainer in our run (rlexp/sft)
        from rlexp.sft.method import check_node

        check_node(OmegaConf.to_container(a, resolve=True))
        return
    if a.get("backend") is not None:  # a method run by another library's trainer (rlexp/preference: TRL)
        if a.backend != "trl":
            raise ConfigError(
                f"algorithm.backend={a.backend!r}: only 'trl' (rlexp.preference), 'sft' (stage=sft, rlexp.sft) or "
                "unset (our trainer)"
            )
        from rlexp.preference.method import check_method

        options = a.get("options")
        check_method(
            a.get("trainer"),
            a.get("beta", 0.1),
            OmegaConf.to_container(a.loss_type) if OmegaConf.is_config(a.get("loss_type")) else a.get("loss_type"),
            OmegaConf.to_container(options, resolve=True) if OmegaConf.is_config(options) else options,
        )
    for part in ("advantage", "loss"):
        node = a.get(part)
        if not isinstance(node, DictConfig) or "_target_" not in node:
            continue
        known = _settings_of(str(node._target_))
        if known is None:
            continue
        names, var_kw = known
        for key in node.keys():
            if str(key).startswith("_") or var_kw or key in names:
                continue
            settings = [n for n in names if n not in ("batch", "logp", "old_logp", "advantages", "mask")]
            raise ConfigError(
                f"algorithm.{part}.{key} is not a setting of {node._target_} (its settings: {', '.join(settings)})"
            )
    loss, adv = a.get("loss") or {}, a.get("advantage") or {}
    clamp = loss.get("log_ratio_clamp") if isinstance(loss, DictConfig) else None
    checks = [
        (
            clamp is None or (isinstance(clamp, (int, float)) and clamp > 0),
            "algorithm.loss.log_ratio_clamp",
            clamp,
            "must be > 0 or null (verl: 20; GSPO's sequence log-ratio: 10)",
        ),
        (
            not isinstance(adv, DictConfig) or adv.get("singleton", "zero") in ("zero", "raw"),
            "algorithm.advantage.singleton",
            adv.get("singleton") if isinstance(adv, DictConfig) else None,
            "must be one of ['zero', 'raw']",
        ),
        (
            not isinstance(adv, DictConfig) or adv.get("batch_level", "sequence") in ("sequence", "token"),
            "algorithm.advantage.batch_level",
            adv.get("batch_level") if isinstance(adv, DictConfig) else None,
            "must be one of ['sequence', 'token']",
        ),
        (
            a.get("token_count_guard", "clamp") in ("clamp", "eps"),
            "algorithm.token_count_guard",
            a.get("token_count_guard"),
            "must be one of ['clamp', 'eps']",
        ),
        (
            a.get("unscored_rows", "count") in ("count", "exclude"),
            "algorithm.unscored_rows",
            a.get("unscored_rows"),
            "must be one of ['count', 'exclude']",
        ),
    ]
    kl = a.get("kl") or OmegaConf.create({})
    checks += [
        (
            not kl.get("clamp", False) or str(kl.get("estimator", "k3")).rstrip("+") == "k3",
            "algorithm.kl.clamp",
            kl.get("clamp"),
            f"is verl's k3 (low_var_kl) clamp; algorithm.kl.estimator={kl.get('estimator')!r}",
        ),
        (
            not kl.get("bias_correction", False) or kl.get("mode", "loss") == "loss",
            "algorithm.kl.bias_correction",
            kl.get("bias_correction"),
            "weights the KL loss term: it needs algorithm.kl.mode=loss",
        ),
    ]
    for ok, key, value, why in checks:
        if not ok:
            raise ConfigError(f"{key}={value}: {why}")


_APPS = {"RLExpConfig": "train", "EvalAppConfig": "eval", "TrainerConfig": "trainer"}


def check_unknown_keys(cfg: DictConfig) -> None:
    """Refuse a key that the schema does not know under a node it types itself (the root, trainer, eval,
    consistency, trial): ``+trainer.max_stepz=2`` gets past OmegaConf's struct check (``+`` adds a key) and would
    be ignored. The open nodes (model, dataset, reward, algorithm, rollout, tracker, …) are not checked."""
    import dataclasses
    import difflib

    from omegaconf import OmegaConf

    def walk(node: DictConfig, path: str) -> None:
        schema = OmegaConf.get_type(node)
        if not dataclasses.is_dataclass(schema):
            return
        known = [f.name for f in dataclasses.fields(schema)]
        for key in node.keys():
            full = f"{path}.{key}" if path else str(key)
            if key not in known and not (not path and key == "hydra"):
                close = difflib.get_close_matches(str(key), known, n=1, cutoff=0.6)
                where = (
                    f"a setting of {path}"
                    if path
                    else f"a top-level key of the {_APPS.get(schema.__name__, schema.__name__)} config"
                )
                prefix = f"{path}." if path else ""
                hint = f"; did you mean {prefix}{close[0]}?" if close else f" (known: {', '.join(known)})"
                raise ConfigError(f"{full} is not {where}{hint}")
            child = node._get_node(key)
            if isinstance(child, DictConfig) and not child._is_none() and not child._is_missing():
                walk(child, full)

    walk(cfg, "")


def check_device(name: str) -> None:
    """``trainer.device``: auto, cpu, cuda, cuda:N or mps, and present on this machine."""
    import torch

    if name == "auto":
        return
    try:
        device = torch.device(name)
    except (RuntimeError, ValueError, TypeError):
        raise ConfigError(f"trainer.device={name!r} is not a device: auto, cpu, cuda, cuda:N or mps") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            build = "a CPU-only build" if torch.version.cuda is None else f"built for CUDA {torch.version.cuda}"
            raise ConfigError(
                f"trainer.device={name}: CUDA is not available on this machine (torch {torch.__version__}, {build}); "
                "use trainer.device=auto or cpu"
            )
        count = torch.cuda.device_count()
        if device.index is not None and device.index >= count:
            raise ConfigError(
                f"trainer.device={name}: this machine has {count} CUDA device(s), cuda:0 to cuda:{count - 1}"
            )
    elif device.type == "mps":
        if not torch.backends.mps.is_available():
            raise ConfigError(f"trainer.device={name}: MPS is not available on this machine; use auto or cpu")
    elif device.type != "cpu":
        raise ConfigError(f"trainer.device={name!r} is not one of auto, cpu, cuda, cuda:N, mps")


def check_eval_ks(n: int, ks, maj_ks) -> None:
    """``eval.ks`` / ``eval.maj_ks``: every k in 1..eval.n (a k above n was dropped without a word before)."""
    if n is None or n < 1:
        raise ConfigError(f"eval.n={n}: must be >= 1")
    for key, values in (("ks", ks), ("maj_ks", maj_ks)):
        if values is not None:
            check_ks(values, n, f"eval.{key}")


def check_ks(ks, n: int, key: str) -> list[int]:
    """Every k of ``ks`` in 1..n, else a ConfigError naming ``key`` and ``eval.n``; the k values as ints."""
    values = [int(k) for k in ks]
    low = [k for k in values if k < 1]
    if low:
        raise ConfigError(f"{key}={values}: every k must be >= 1 (got {low[0]})")
    high = [k for k in values if k > n]
    if high:
        raise ConfigError(
            f"{key}={values}: k={high[0]} is more than eval.n={n} samples per problem; "
            f"raise eval.n or keep every k <= {n}"
        )
    return values


def _check_async_rollout(rollout: DictConfig) -> None:
    """``trainer.async_rollout``: a rollout engine that can generate from a copy of the policy in another thread
    with a generator of its own (rlexp/trainer/async_rollout.py)."""
    target = str(rollout.get("_target_", ""))
    if not target.endswith("HFRollout"):
        raise ConfigError(
            f"trainer.async_rollout=true needs rollout=hf (rlexp.rollout.hf.HFRollout); rollout._target_={target} "
            "is not supported (vLLM: the weight push and the engine would run beside the update)"
        )
    if rollout.get("engine", "loop") != "loop":
        raise ConfigError(
            f"trainer.async_rollout=true needs rollout.engine=loop (got {rollout.get('engine')!r}): transformers "
            "generate samples from the global RNG, which the trainer thread shares, so the run would depend on timing"
        )
    if (rollout.get("speculative_reuse") or {}).get("enabled"):
        raise ConfigError(
            "trainer.async_rollout=true does not combine with rollout.speculative_reuse.enabled=true (SPEC-RL): its "
            "drafts come from the rollout cache of the previous step, which the rollout generated ahead would read "
            "before that step's rollout was cached, and its acceptance draws use the global RNG the trainer thread "
            "shares"
        )
    if rollout.get("cache_implementation") == "static" and rollout.get("decode_graph") is not None:
        raise ConfigError(
            f"trainer.async_rollout=true does not support rollout.decode_graph={rollout.get('decode_graph')} (CUDA "
            "graphs captured or compiled in the rollout thread while the trainer thread allocates: not built or run "
            "here); set rollout.decode_graph=null"
        )


COMPILE_MODES = (None, "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


def _check_compile(t: DictConfig) -> None:
    import torch._dynamo

    backends = torch._dynamo.list_backends(exclude_tags=())
    if t.compile_backend not in backends:
        raise ConfigError(f"trainer.compile_backend={t.compile_backend!r} is not a torch.compile backend ({backends})")
    if t.compile_mode not in COMPILE_MODES:
        raise ConfigError(f"trainer.compile_mode={t.compile_mode!r} is not one of {list(COMPILE_MODES)}")
