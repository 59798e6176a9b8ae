"""Training run assembly: build every part from a composed config (dataset, prompt, rewards, algorithm,
rollout, model, optimiser, sampler, trackers, evaluators), train, and return the final metrics (the
Optuna sweeper reads its objective from them). The command is ``rlexp train`` (``rlexp.commands.train``)."""

from __future__ import annotations

import logging
from contextlib import contextmanager, nullcontext
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from rlexp.config.schema import validate
from rlexp.preference.runner import is_trl_backed
from rlexp.runs.setup import (
    build,
    build_reward_term,
    build_scheduler,
    build_trackers,
    link_latest,
    prepare_process,
    release_device_memory,
)
from rlexp.sft.method import is_sft
from rlexp.tracking.params import flatten

log = logging.getLogger("rlexp.train")


def make_evaluator(cfg: DictConfig, data, prompt_format, rollout, consistency=None):
    """Greedy accuracy on the held-out split (``eval.size`` prompts) and, with ``+benchmark=<entry>``,
    the benchmarks (``rlexp.evaluation.runner.training_evaluator``); run every trainer.eval_every steps."""
    evaluators = []
    acc = cfg.trainer.accuracy_term
    if cfg.eval.size > 0:
        from rlexp.evaluation.greedy import GreedyEvaluator

        evaluators.append(
            GreedyEvaluator(
                data.eval[: cfg.eval.size],
                prompt_format,
                rollout,
                acc and build_reward_term(cfg.reward.terms[acc], f"reward.terms.{acc}"),
                max_new_tokens=cfg.eval.max_new_tokens,
                paraphrases=cfg.eval.paraphrases,
                paraphrase_source=cfg.eval.paraphrase_source,
                seed=cfg.trainer.seed,
                by=cfg.eval.get("by"),
            )
        )
    if cfg.get("benchmark"):
        from rlexp.evaluation.runner import training_evaluator

        evaluators.append(training_evaluator(cfg, data, rollout, consistency))
    if len(evaluators) <= 1:
        return evaluators[0] if evaluators else None
    return lambda model, tok, step: {k: v for e in evaluators for k, v in e(model, tok, step).items()}


def run(cfg: DictConfig, callbacks: list | None = None):
    """Build everything from a composed config and train. Returns ``TrainResult``."""
    validate(cfg)
    from rlexp.sweeping.callback import sweep_callbacks  # a job of an Optuna sweep reports to its trial

    given = list(callbacks or [])
    callbacks = [*given, *sweep_callbacks(cfg)]
    t = cfg.trainer
    device = prepare_process(t)
    run_dir = Path(t.run_dir)
    dist = None
    if cfg.get("distributed") is not None:  # conf/distributed: under accelerate launch / torchrun
        dist, device, run_dir = _distributed(cfg, device, run_dir)
        if dist is not None and not dist.is_main:
            callbacks = given  # a sweep's trial hears from the main process only
    try:
        with hold_run_dir(run_dir) if dist is None or dist.is_main else nullcontext():
            return _run(cfg, t, device, run_dir, callbacks, dist)
    finally:
        release_device_memory(device)
        if dist is not None:
            dist.close()


def _distributed(cfg: DictConfig, device, run_dir: Path):
    """``distributed=ddp`` (``rlexp.trainer.distributed``): this process's ``Distributed`` (None for one process
    under distributed=none), its device and the run directory of the main process."""
    from rlexp.config.schema import ConfigError
    from rlexp.trainer.distributed import setup

    dist, device = setup(cfg, device)
    if dist is None:
        return None, device, run_dir
    if dist.active and (is_trl_backed(cfg) or is_sft(cfg)):
        raise ConfigError(
            "distributed=ddp trains rlexp's RL step; TRL-backed methods (algorithm.backend=trl) and stage=sft run "
            "TRL's trainers, which `accelerate launch` distributes by themselves without distributed=ddp"
        )
    return dist, device, dist.agree_run_dir(run_dir)


@contextmanager
def hold_run_dir(run_dir: Path):
    """An exclusive lock on ``<run dir>/.run.lock`` for the whole run: a second process started on the same run
    directory stops at once, before it writes anything, instead of logging the same steps twice. The operating
    system drops the lock when the holder dies, so a killed run resumes."""
    from filelock import FileLock, Timeout

    from rlexp.config.schema import ConfigError

    run_dir.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(run_dir / ".run.lock"), timeout=0)
    try:
        lock.acquire()
    except Timeout:
        raise ConfigError(
            f"trainer.run_dir={run_dir}: another process is training in this run directory; wait for it to end "
            "(it resumes from here after a kill) or start in a new directory"
        ) from None
    try:
        yield
    finally:
        lock.release()


def _run(cfg: DictConfig, t, device, run_dir: Path, callbacks: list, dist=None):
    """Build and train. A fresh run writes its files (config.yaml, provenance.json, run.json) at once; a resume
    only after its checkpoint has loaded, so a failed resume leaves the run directory as it was. Whatever
    fails before training marks the written provenance FAILED. Under distributed=ddp only the main process does
    this; the others build the same trainer without trackers or evaluation and train beside it."""
    if dist is not None and not dist.is_main:
        from rlexp.runs.identity import RunIdentity

        identity = RunIdentity(uid="", path=str(run_dir.resolve()), created="")  # never saved: the main's is
        trainer, _ = _build(cfg, t, device, run_dir, callbacks, {}, identity, dist)
        return trainer.train()
    from rlexp.runs.identity import claim_identity
    from rlexp.tracking.provenance import collect_provenance, finish_provenance, run_tags, save_provenance
    from rlexp.trainer.checkpoint import find_checkpoint

    identity = claim_identity(run_dir, t.resume)
    prov = {**collect_provenance(cfg, run_dir), "run_uid": identity.uid}
    resuming = t.resume and find_checkpoint(run_dir / "checkpoints") is not None
    if is_trl_backed(cfg) or is_sft(cfg):  # TRL-backed runs resume from transformers' checkpoint-N directories
        from rlexp.preference.runner import find_trl_checkpoint

        resuming = t.resume and find_trl_checkpoint(run_dir) is not None
    written = False
    if not resuming:
        save_provenance(cfg, run_dir, prov)
        identity.save(run_dir)
        written = True
    trainer, tracker = None, None
    try:
        trainer, tracker = _build(cfg, t, device, run_dir, callbacks, run_tags(cfg, prov, run_dir), identity, dist)
        if resuming:
            trainer.restore()
            save_provenance(cfg, run_dir, prov)
            identity.save(run_dir)
            written = True
        link_latest(run_dir)
        return trainer.train()
    finally:
        if trainer is None or trainer.finished is None:  # it failed before training: its status is FAILED
            if written:
                finish_provenance(run_dir, "FAILED")
        else:
            report(run_dir, trainer.finished, tracker)


def _build(cfg: DictConfig, t, device, run_dir: Path, callbacks: list, tags: dict, identity, dist=None):
    if is_trl_backed(cfg):  # algorithm.backend=trl: TRL's DPO/KTO/ORPO/online-DPO trainer in our run (rlexp.preference)
        from rlexp.preference.runner import build_run

        return build_run(cfg, t, device, run_dir, callbacks, tags, identity)
    if is_sft(cfg):  # stage=sft: TRL's SFTTrainer in our run (rlexp.sft)
        from rlexp.sft.runner import build_run as build_sft_run

        return build_sft_run(cfg, t, device, run_dir, callbacks, tags, identity)
    from rlexp.models.loading import load_model
    from rlexp.trainer.loop import Trainer

    data = build(cfg.dataset, "dataset")
    if cfg.get("view") is not None:  # view=multiple_choice: the records rewritten (rlexp.data.multiple_choice)
        data = build(cfg.view, "view")(data)
    prompt_format = build(cfg.prompt, "prompt")
    reward_terms = {name: build_reward_term(term, f"reward.terms.{name}") for name, term in cfg.reward.terms.items()}
    algorithm = build(cfg.algorithm, "algorithm", _convert_="all")
    rollout = build(cfg.rollout, "rollout")
    loaded = load_model(cfg.model, device)
    main = dist is None or dist.is_main
    if dist is not None:  # every process starts from the main process's weights (what DDP does when it wraps)
        dist.broadcast_parameters(loaded.model)
        dist.prepare_sharded(cfg, algorithm, loaded.model)  # fsdp / deepspeed: refusals; fsdp shards here
    # trainable parameters only: under model/peft=lora the adapters (the frozen base gets no optimiser state)
    optimizer = build(cfg.optimizer, "optimizer")([p for p in loaded.model.parameters() if p.requires_grad])
    if dist is not None:  # distributed=deepspeed_zero*: DeepSpeed's engine around the model and this optimiser
        dist.prepare_optimizer(loaded.model, optimizer, t.max_grad_norm)
    sampler = build(cfg.sampler, "sampler")(data.train, t.prompts_per_step, t.seed) if cfg.get("sampler") else None
    steps_per_rollout = t.steps_per_rollout or algorithm.steps_per_rollout
    mu = t.num_iterations or algorithm.num_iterations
    passes = 1 + algorithm.slow_fast.fast_steps  # SFPO: K fast passes and the slow one
    scheduler = build_scheduler(optimizer, t.warmup_steps, mu * steps_per_rollout * passes)
    tracker, jsonl = build_trackers(cfg, run_dir, main)
    from rlexp.evaluation.consistency import meter_from_config

    consistency = meter_from_config(cfg.consistency) if "consistency" in cfg else None
    container = OmegaConf.to_container(cfg, resolve=True)
    trainer = Trainer(
        settings=t,
        model=loaded.model,
        tokenizer=loaded.tokenizer,
        algorithm=algorithm,
        reward_terms=reward_terms,
        rollout=rollout,
        data=data,
        prompt_format=prompt_format,
        optimizer=optimizer,
        scheduler=scheduler,
        tracker=tracker,
        jsonl=jsonl,
        run_dir=run_dir,
        run_name=cfg.run_name or run_dir.name,
        config=container,
        params=flatten(container),
        tags={**tags, **identity.tags()},
        accuracy_term=t.accuracy_term,
        evaluator=make_evaluator(cfg, data, prompt_format, rollout, consistency) if main else None,
        callbacks=callbacks,
        consistency=consistency,
        sampler=sampler,
        continue_tracker_runs=identity.continues,
        dist=dist,
    )
    for cb in callbacks:
        if hasattr(cb, "bind"):  # callbacks that need the trainer (tracker tags, run dir)
            cb.bind(trainer)
    return trainer, tracker


def report(run_dir: Path, status: str, tracker) -> None:
    """The end-of-run summary (``rlexp.runs.summary``), printed and written to ``<run dir>/summary.md``; a
    failure here never hides the run's own outcome."""
    from rlexp.runs.summary import print_summary, summarise, write_summary

    try:
        summary = summarise(run_dir, status, tracker.describe())
        log.info("summary: %s", write_summary(summary))
        print_summary(summary)
    except Exception as e:  # the summary is a report, not part of the run
        log.warning("could not write the run summary: %r", e)
