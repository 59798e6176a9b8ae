"""The algorithm node of a TRL-backed preference method (``conf/algorithm/{dpo,ipo,kto,orpo,online_dpo}.yaml``,
``backend: trl``): which TRL trainer runs, its β and loss type, and further TRL config fields as they are.

What TRL 1.16 has (read in its source): ``trl.DPOTrainer``/``DPOConfig`` and ``trl.KTOTrainer``/``KTOConfig``
(stable API); ``ORPOTrainer`` and ``OnlineDPOTrainer`` only under ``trl.experimental.orpo`` and
``trl.experimental.online_dpo``. ``check_method`` runs in the config checks (``rlexp.config.schema``): a bad
trainer or loss type is refused there, naming the key."""

from __future__ import annotations

from dataclasses import dataclass, field

TRAINERS = ("dpo", "kto", "orpo", "online_dpo")
# loss types each TRL 1.16 trainer takes (DPOConfig.loss_type, KTOConfig.loss_type, OnlineDPOConfig.loss_type);
# ORPO has one loss (its odds-ratio term weighted by beta = λ), so no loss_type
LOSS_TYPES: dict[str, tuple[str, ...]] = {
    "dpo": (
        "sigmoid",
        "hinge",
        "ipo",
        "exo_pair",
        "nca_pair",
        "robust",
        "bco_pair",
        "sppo_hard",
        "aot",
        "aot_unpaired",
        "apo_zero",
        "apo_down",
        "discopop",
        "sft",
        "sigmoid_norm",
    ),
    "kto": ("kto", "apo_zero_unpaired"),
    "orpo": (),
    "online_dpo": ("sigmoid", "ipo"),
}
# the data each trainer reads (rlexp.preference.data.PreferenceData.rows)
DATA_KIND = {"dpo": "paired", "orpo": "paired", "kto": "unpaired", "online_dpo": "prompts"}


def check_method(trainer, beta, loss_type, options) -> None:
    """Raise ``ConfigError`` naming the key of the first bad setting."""
    from rlexp.config.schema import ConfigError

    if trainer not in TRAINERS:
        raise ConfigError(f"algorithm.trainer={trainer!r}: one of {list(TRAINERS)} (TRL-backed preference methods)")
    if not isinstance(beta, (int, float)) or isinstance(beta, bool) or beta <= 0:
        raise ConfigError(f"algorithm.beta={beta!r}: must be a number > 0")
    allowed = LOSS_TYPES[trainer]
    if not allowed and loss_type is not None:
        raise ConfigError(f"algorithm.loss_type={loss_type!r}: TRL's {trainer} trainer has one loss; set it to null")
    if allowed:
        types = [loss_type] if isinstance(loss_type, str) else list(loss_type or [])
        if not types or (len(types) > 1 and trainer != "dpo"):
            raise ConfigError(f"algorithm.loss_type={loss_type!r}: one of {list(allowed)}")
        for lt in types:
            if lt not in allowed:
                raise ConfigError(f"algorithm.loss_type={lt!r}: TRL 1.16's {trainer} takes one of {list(allowed)}")
    if options is not None and not isinstance(options, dict):
        raise ConfigError(f"algorithm.options={options!r}: a mapping of TRL config fields")
    reserved = {"beta", "loss_type", "output_dir", "max_steps", "learning_rate", "seed", "report_to"}
    clash = sorted(reserved & set(options or {}))
    if clash:
        raise ConfigError(
            f"algorithm.options.{clash[0]}: set by rlexp (algorithm.beta / algorithm.loss_type / trainer.* / "
            "optimizer.lr), not through algorithm.options"
        )


@dataclass
class PreferenceMethod:
    """Built from the algorithm node (``_target_``); ``rlexp.preference.runner`` reads it."""

    trainer: str
    beta: float = 0.1
    loss_type: str | list[str] | None = "sigmoid"
    options: dict = field(default_factory=dict)  # further TRL config fields (label_smoothing, desirable_weight, …)
    # the node's descriptive fields (rlexp list algorithms, the registry)
    name: str = ""
    paper: str = ""
    family: str = "preference"
    mechanism: str = ""
    backend: str = "trl"

    def __post_init__(self):
        self.options = dict(self.options or {})
        check_method(self.trainer, self.beta, self.loss_type, self.options)

    @property
    def data_kind(self) -> str:
        return DATA_KIND[self.trainer]
