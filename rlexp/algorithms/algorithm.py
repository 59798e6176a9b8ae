"""A method = one advantage estimator + one policy loss + an aggregation mode + regularisers +
group stages, each a small part named by ``_target_`` in ``conf/algorithm/<method>.yaml``."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from rlexp.algorithms.aggregation import MODES
from rlexp.algorithms.kl import ESTIMATORS
from rlexp.algorithms.reference import KINDS


@dataclass
class KLSettings:
    coef: float = 0.0
    estimator: str = "k3"
    mode: str = "loss"  # "loss": β·KL added per token; "reward": β·Σ_t KL subtracted from the reward


@dataclass
class ReferenceSettings:
    kind: str = "frozen"
    ema_decay: float = 0.995
    ema_interval: int = 10


@dataclass
class Algorithm:
    name: str
    advantage: Callable
    loss: Callable
    paper: str = ""
    aggregation: str = "token-mean"
    count_empty_rows: bool = False
    norm_length: float | None = None
    kl: KLSettings = field(default_factory=KLSettings)
    reference: ReferenceSettings = field(default_factory=ReferenceSettings)
    entropy_coef: float = 0.0
    group_stages: list = field(default_factory=list)

    def __post_init__(self):
        if isinstance(self.kl, dict) or not isinstance(self.kl, KLSettings):
            self.kl = KLSettings(**dict(self.kl))
        if not isinstance(self.reference, ReferenceSettings):
            self.reference = ReferenceSettings(**dict(self.reference))
        self.group_stages = list(self.group_stages or [])
        if self.aggregation not in MODES:
            raise ValueError(f"algorithm.aggregation={self.aggregation!r} is not one of {MODES}")
        if self.kl.estimator not in ESTIMATORS:
            raise ValueError(f"algorithm.kl.estimator={self.kl.estimator!r} is not one of {ESTIMATORS}")
        if self.kl.mode not in ("loss", "reward"):
            raise ValueError(f"algorithm.kl.mode={self.kl.mode!r} is not one of ['loss', 'reward']")
        if self.kl.coef < 0:
            raise ValueError(f"algorithm.kl.coef must be >= 0, got {self.kl.coef}")
        if self.reference.kind not in KINDS:
            raise ValueError(f"algorithm.reference.kind={self.reference.kind!r} is not one of {KINDS}")
        if self.needs_reference and self.reference.kind == "none":
            raise ValueError("algorithm.reference.kind=none but the KL term or a group stage needs a reference model")

    @property
    def needs_reference(self) -> bool:
        return self.kl.coef > 0 or any(getattr(s, "needs_reference", False) for s in self.group_stages)
