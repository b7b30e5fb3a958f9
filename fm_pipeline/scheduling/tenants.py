"""Tenants config: who may use how much of the pool, with which weight and priorities.

    from fm_pipeline.scheduling import load_tenants
    tenants = load_tenants("configs/tenants.yaml")   # TenantsConfigError names each bad field

The pool is what the cluster (or this machine) offers per resource (`gpu`, optionally
`cpu`, `memory_gib`). Each tenant has a guaranteed `quota` per resource; the rest of the
pool (capacity minus the quotas) is the cohort's shared pool that any tenant may borrow,
up to its `borrowing_limit`. Borrowed capacity is split by fair-share `weight` and may be
reclaimed by preemption. The same file renders Kueue objects (`fm api kueue render`).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from fm_pipeline.config.strict_yaml import YamlError, load_yaml
from fm_pipeline.defaults import TENANTS


def priority_values() -> dict[str, int]:
    """The job spec's priority classes (low, normal, high, urgent) and their values."""
    # Imported here: fm_pipeline.config pulls in the model package (and torch) today.
    from fm_pipeline.config.spec import PRIORITY_VALUES

    return PRIORITY_VALUES


_DNS_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
RESOURCES = ("gpu", "cpu", "memory_gib")
Resource = Literal["gpu", "cpu", "memory_gib"]
DEFAULT_TENANTS = TENANTS  # shipped with the package (fm_pipeline/defaults/tenants.yaml)


class TenantsConfigError(ValueError):
    """A tenants config that cannot be used; `problems` lists (field path, message) pairs."""

    def __init__(self, source: str, problems: list[tuple[str, str]]):
        self.source = source
        self.problems = problems
        lines = "\n".join(f"  - {field}: {msg}" for field, msg in problems)
        super().__init__(f"invalid tenants config {source}:\n{lines}")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)


def _dns(value: str) -> str:
    if not _DNS_RE.fullmatch(value) or len(value) > 40:
        raise ValueError(f"{value!r} must be <= 40 lowercase letters, digits and '-'")
    return value


class TenantSpec(_Strict):
    name: str
    weight: float = Field(default=1.0, ge=0, description="fair-share weight of borrowed capacity")
    quota: dict[Resource, int] = Field(default_factory=dict, description="guaranteed, per resource")
    borrowing_limit: dict[Resource, int] | None = Field(
        default=None, description="most it may use above its quota; None: the whole shared pool"
    )
    priorities: list[str] = Field(default_factory=lambda: ["low", "normal"], min_length=1)
    namespace: str | None = Field(default=None, description="Kubernetes namespace; default: name")

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        return _dns(v)

    @field_validator("quota", "borrowing_limit")
    @classmethod
    def _non_negative(cls, v):
        for res, amount in (v or {}).items():
            if amount < 0:
                raise ValueError(f"{res} must be >= 0, got {amount}")
        return v

    @field_validator("priorities")
    @classmethod
    def _known_priorities(cls, v: list[str]) -> list[str]:
        known = priority_values()
        unknown = [p for p in v if p not in known]
        if unknown:
            raise ValueError(
                f"unknown priority class {', '.join(unknown)}; known: {', '.join(known)}"
            )
        return v

    @property
    def k8s_namespace(self) -> str:
        return self.namespace or self.name


class PreemptionSpec(_Strict):
    max_per_job_per_hour: int = Field(default=2, ge=0, description="0: never preempt a job")
    grace_s: float = Field(default=120.0, gt=0, description="SIGTERM to SIGKILL: time to checkpoint")


class KueueSpec(_Strict):
    """How the pool looks to Kubernetes: resource names, flavor, cohort and topology."""

    cohort: str = "fm-pipeline"
    flavor: str = "gpu-default"
    node_labels: dict[str, str] = Field(
        default_factory=lambda: {"nvidia.com/gpu.present": "true"},
        description="labels of the nodes the flavor stands for (a topology needs one)",
    )
    resource_names: dict[Resource, str] = Field(
        default_factory=lambda: {"gpu": "nvidia.com/gpu", "cpu": "cpu", "memory_gib": "memory"}
    )
    topology: str | None = "fm-topology"
    topology_levels: list[str] = Field(
        default_factory=lambda: [
            "cloud.provider.com/topology-block",
            "cloud.provider.com/topology-rack",
            "kubernetes.io/hostname",
        ]
    )

    @field_validator("cohort", "flavor")
    @classmethod
    def _names(cls, v: str) -> str:
        return _dns(v)


class TenantsConfig(_Strict):
    pool: dict[Resource, int] = Field(description="what the cluster offers, per resource")
    launcher: Literal["local", "kubernetes"] = Field(
        default="local",
        description="what runs the pool's jobs: local (torchrun on this machine: each job "
                    "is also checked against its cores, memory and GPUs before it is "
                    "queued) or kubernetes (JobSets queued by Kueue)")
    admission: Literal["api", "kueue"] = Field(
        default="api",
        description="who decides which job runs: api (the control plane's fair-share "
                    "policy admits and preempts; on Kubernetes, Kueue then only confirms) "
                    "or kueue (kubernetes only: every job is handed to Kueue at once and "
                    "the ClusterQueues rendered from this file queue, admit and preempt; "
                    "the API's per-job preemption bound does not apply, Kueue has none)")
    tenants: list[TenantSpec] = Field(min_length=1)
    preemption: PreemptionSpec = PreemptionSpec()
    kueue: KueueSpec = KueueSpec()
    cluster: dict[str, str | int | float] = Field(
        default_factory=dict,
        description="the job spec's cluster: section every API job gets (accelerator, "
                    "gpus_per_node, storage_write_gbps, ...): what the pool is made of, so "
                    "the API plans and critiques jobs for it; {}: this machine's CPUs")

    @field_validator("cluster")
    @classmethod
    def _cluster(cls, v: dict) -> dict:
        from fm_pipeline.config.spec import ClusterSpec

        try:
            ClusterSpec.model_validate(v)
        except ValidationError as e:
            raise ValueError("; ".join(f"{'.'.join(map(str, err['loc']))}: {err['msg']}"
                                       for err in e.errors(include_url=False))) from None
        return v

    @field_validator("pool")
    @classmethod
    def _pool(cls, v: dict[str, int]) -> dict[str, int]:
        if "gpu" not in v:
            raise ValueError("must list gpu")
        for res, amount in v.items():
            if amount <= 0:
                raise ValueError(f"{res} must be > 0, got {amount}")
        return v

    @model_validator(mode="after")
    def _quotas_fit(self) -> "TenantsConfig":
        if self.admission == "kueue" and self.launcher != "kubernetes":
            raise ValueError(f"admission: kueue needs launcher: kubernetes (got launcher: "
                             f"{self.launcher}): Kueue admits only JobSets")
        names = [t.name for t in self.tenants]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"tenants: names must be unique; repeated: {', '.join(dupes)}")
        problems = []
        for i, t in enumerate(self.tenants):
            for res in [*t.quota, *(t.borrowing_limit or {})]:
                if res not in self.pool:
                    problems.append(f"tenants.{i}.quota: {res} is not in the pool")
        for res, capacity in self.pool.items():
            total = sum(t.quota.get(res, 0) for t in self.tenants)
            if total > capacity:
                detail = ", ".join(f"{t.name}={t.quota.get(res, 0)}" for t in self.tenants)
                problems.append(
                    f"tenants: {res} quotas sum to {total} ({detail}), more than the pool ({capacity})"
                )
        if problems:
            raise ValueError("\n".join(problems))
        return self

    def tenant(self, name: str) -> TenantSpec:
        for t in self.tenants:
            if t.name == name:
                return t
        raise KeyError(name)

    @property
    def tenant_names(self) -> list[str]:
        return [t.name for t in self.tenants]

    def shared_pool(self) -> dict[str, int]:
        """Capacity no tenant is guaranteed: the cohort's own quota, lent by fair share."""
        return {
            res: cap - sum(t.quota.get(res, 0) for t in self.tenants)
            for res, cap in self.pool.items()
        }


_PREFIXED = re.compile(r"^([a-z_][a-z0-9_.]*): (.+)$")


def parse_tenants(data: object, *, source: str = "<dict>") -> TenantsConfig:
    if not isinstance(data, dict):
        raise TenantsConfigError(source, [("(root)", f"expected a mapping, got {type(data).__name__}")])
    try:
        return TenantsConfig.model_validate(data)
    except ValidationError as e:
        problems = []
        for err in e.errors():
            base = ".".join(str(p) for p in err["loc"] if p != "[key]") or "(root)"
            for line in err["msg"].removeprefix("Value error, ").splitlines():
                m = _PREFIXED.match(line)
                problems.append((m.group(1), m.group(2)) if m and base == "(root)" else (base, line))
        raise TenantsConfigError(source, problems) from None


def load_tenants(path: str | Path | None = None) -> TenantsConfig:
    """Parse a tenants YAML file; None: the embedded default (fm_pipeline/defaults)."""
    path = Path(path) if path is not None else DEFAULT_TENANTS
    if not path.is_file():
        raise TenantsConfigError(str(path), [("(file)", "no such file")])
    try:
        data = load_yaml(path.read_text(encoding="utf-8"), source=str(path))
    except (YamlError, UnicodeDecodeError) as e:
        raise TenantsConfigError(str(path), [("(yaml)", str(e))]) from None
    return parse_tenants(data, source=str(path))
