"""The launch spec: one training segment as a `torchrun` invocation.

    launch = SegmentLaunch(job, end_step=20)
    argv = launch.torchrun_argv(Standalone(nproc=2), paths=local_paths(segment_dir))
    # ['torchrun', '--standalone', '--nnodes', '1', '--nproc-per-node', '2', '--log-dir', ...,
    #  '--max-restarts', '0', '--shutdown-timeout', '30', '-m', 'fm_pipeline.train',
    #  '--job', '<segment_dir>/job.yaml', '--end-step', '20']

The local launcher and the Kubernetes pod run the same invocation; only the rendezvous
arguments and the paths differ. On Kubernetes the rendezvous comes from the PET_* variables
Kubeflow Trainer v2 uses, written as `$(PET_NNODES)` so the kubelet expands them.
torchrun loses a failed worker's exit code (it exits 1), so every invocation names a log
directory (one error file per worker) and an error file for the agent: the outcome is read
back from them (see outcome.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from fm_pipeline.config import JobSpec, dump_job
from fm_pipeline.config.strict_yaml import dump_yaml
from fm_pipeline.config.worker_env import PREEMPT_FILE_ENV

TRAINER_MODULE = "fm_pipeline.train"
# Seconds torchrun waits, after forwarding SIGTERM, beyond the trainer's preemption grace.
SHUTDOWN_MARGIN_S = 5


@dataclass(frozen=True)
class Standalone:
    """Every rank of the job on this machine, with torchrun's private rendezvous."""

    nproc: int

    def args(self) -> list[str]:
        return ["--standalone", "--nnodes", "1", "--nproc-per-node", str(self.nproc)]


@dataclass(frozen=True)
class PetRendezvous:
    """c10d rendezvous from the PET_* environment (one torchrun agent per node/pod).

    The values stay `$(VAR)` references: the kubelet (or pod_local.expand_k8s_vars)
    substitutes them from the container's environment.
    """

    rdzv_id: str

    def args(self) -> list[str]:
        # No --node-rank: c10d ranks nodes itself (sorted by host name, so the pod with
        # completion index 0 hosts global rank 0, the one that speaks Dagster Pipes).
        return [
            "--nnodes", "$(PET_NNODES)",
            "--nproc-per-node", "$(PET_NPROC_PER_NODE)",
            "--rdzv-backend", "c10d",
            "--rdzv-endpoint", "$(PET_MASTER_ADDR):$(PET_MASTER_PORT)",
            "--rdzv-id", self.rdzv_id,
        ]


Rendezvous = Standalone | PetRendezvous

NO_SHARED_STORE_ENV = "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"


@dataclass(frozen=True)
class SegmentPaths:
    """Where one segment's invocation reads its spec and leaves its evidence."""

    job_file: Path
    log_dir: Path  # torchrun --log-dir: <run>/attempt_<k>/<local_rank>/error.json per worker
    error_file: Path  # TORCHELASTIC_ERROR_FILE of the torchrun agent (root cause copy)
    preempt_flag: Path

    def env(self) -> dict[str, str]:
        """The agent's environment around the command (local process and pod alike)."""
        return {"TORCHELASTIC_ERROR_FILE": str(self.error_file),
                PREEMPT_FILE_ENV: str(self.preempt_flag),
                # A fresh worker store per rendezvous round. The shared one (torch's default)
                # is never re-announced to a node that joins after a restart: a spare that
                # replaces a lost node waits for MASTER_ADDR in the new round's keys until
                # its rendezvous times out (dynamic_rendezvous.py keeps the first round's
                # bootstrap info on the survivors). Opting out is torch's documented switch.
                NO_SHARED_STORE_ENV: "1"}


def local_paths(segment_dir: Path) -> SegmentPaths:
    return SegmentPaths(
        job_file=segment_dir / "job.yaml",
        log_dir=segment_dir / "torchrun",
        error_file=segment_dir / "error.json",
        preempt_flag=segment_dir / "preempt",
    )


@dataclass(frozen=True)
class SegmentLaunch:
    """Train `job` from its latest valid checkpoint (or `resume_from`) up to `end_step`, as
    one torchrun job."""

    job: JobSpec
    end_step: int
    module: str = TRAINER_MODULE
    overrides: tuple[str, ...] = field(default=())  # trainer --set dotted.key=value
    # torchrun's in-place restarts (None: the job's resilience.inplace_restarts); the
    # JobSet's restarts of whole pods are another budget (jobset.py).
    max_restarts: int | None = None
    resume_from: str | None = None  # trainer --resume-from: this checkpoint, not the newest
    # resume_from is the orchestrator's plan (plan_segment), not a rollback the user chose:
    # the trainer restores the newest valid checkpoint instead when it fails validation.
    planned: bool = False

    def __post_init__(self):
        if self.end_step < 1:
            raise ValueError(f"end_step must be >= 1, got {self.end_step}")
        if self.end_step > self.job.training.steps:
            raise ValueError(
                f"end_step {self.end_step} is past the job's target step "
                f"training.steps={self.job.training.steps}"
            )
        if self.max_restarts is not None and self.max_restarts < 0:
            raise ValueError(f"max_restarts must be >= 0, got {self.max_restarts}")
        for item in self.overrides:
            if "=" not in item or item.startswith("="):
                raise ValueError(f"override {item!r} must look like dotted.key=value")

    @property
    def restarts(self) -> int:
        return self.job.resilience.inplace_restarts if self.max_restarts is None \
            else self.max_restarts

    @property
    def rdzv_id(self) -> str:
        return f"{self.job.name}-{self.end_step}"

    @property
    def shutdown_timeout_s(self) -> int:
        return math.ceil(self.job.training.preemption_grace_s) + SHUTDOWN_MARGIN_S

    def standalone(self) -> Standalone:
        """All ranks on one machine: nnodes x nproc_per_node local workers."""
        return Standalone(nproc=self.job.parallelism.world_size)

    def pet_rendezvous(self) -> PetRendezvous:
        return PetRendezvous(rdzv_id=self.rdzv_id)

    def torchrun_argv(self, rendezvous: Rendezvous, *, paths: SegmentPaths) -> list[str]:
        trainer_args = ["--job", str(paths.job_file), "--end-step", str(self.end_step)]
        if self.resume_from:
            trainer_args += ["--resume-from", self.resume_from]
            if self.planned:
                trainer_args.append("--planned")
        for item in self.overrides:
            trainer_args += ["--set", item]
        return [
            "torchrun",
            *rendezvous.args(),
            "--log-dir", str(paths.log_dir),
            "--max-restarts", str(self.restarts),
            "--shutdown-timeout", str(self.shutdown_timeout_s),
            "-m", self.module,
            *trainer_args,
        ]

    def job_yaml(self) -> str:
        """The resolved spec the segment trains with (a file locally, a ConfigMap in a pod)."""
        return dump_yaml(dump_job(self.job))
