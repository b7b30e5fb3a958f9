"""What an evaluation of a checkpoint found: held-out loss and perplexity per data domain.

Perplexity is exp(mean next-token cross-entropy) over the domain's held-out windows: the
same windows, in the same order, for every checkpoint of a job, so numbers compare across
steps. The JSON form is what the `eval` mark of a checkpoint records (marks/eval.json).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field


@dataclass(frozen=True)
class DomainLoss:
    """One data domain (a source of the mix) on its held-out windows."""

    loss: float | None  # mean next-token cross-entropy (nats); None: no held-out windows
    tokens: int  # target tokens evaluated
    batches: int

    @property
    def perplexity(self) -> float | None:
        return None if self.loss is None else math.exp(min(self.loss, 700.0))


@dataclass
class EvalResult:
    job: str
    step: int  # 0 with `at_init`: the model as training initialises it
    checkpoint: str | None
    domains: dict[str, DomainLoss] = field(default_factory=dict)
    world_size: int = 1
    topology: str = ""
    restore_s: float = 0.0
    eval_s: float = 0.0
    wall_s: float = 0.0

    @property
    def loss(self) -> float | None:
        """Token-weighted mean over the domains that have held-out data."""
        scored = [d for d in self.domains.values() if d.loss is not None and d.tokens]
        if not scored:
            return None
        return sum(d.loss * d.tokens for d in scored) / sum(d.tokens for d in scored)

    @property
    def perplexity(self) -> float | None:
        return None if self.loss is None else math.exp(min(self.loss, 700.0))

    def to_dict(self) -> dict:
        data = asdict(self)
        data["domains"] = {name: {**asdict(d), "perplexity": d.perplexity}
                           for name, d in self.domains.items()}
        data["loss"], data["perplexity"] = self.loss, self.perplexity
        return data

    @classmethod
    def from_dict(cls, data: dict) -> EvalResult:
        domains = {name: DomainLoss(loss=d["loss"], tokens=int(d["tokens"]),
                                    batches=int(d["batches"]))
                   for name, d in (data.get("domains") or {}).items()}
        fields = {k: v for k, v in data.items()
                  if k in cls.__dataclass_fields__ and k != "domains"}
        return cls(**fields, domains=domains)

    def summary(self) -> str:
        where = f"step {self.step}" if self.checkpoint else "initialisation"
        parts = [f"{name} loss {d.loss:.4f} ppl {d.perplexity:.1f}"
                 for name, d in self.domains.items() if d.loss is not None]
        return f"{self.job} {where}: " + ("; ".join(parts) or "no held-out data")
