"""One workspace (FM_HOME with the small real data mix) shared by the trainer's launches, and
the layouts launch: every parallelism layout the spec accepts at 4 ranks, trained in one
torchrun start-up. Its fsdp4 job (checkpoints every 2 steps) is the reference run that the
resume and resharding tests continue from; the same launch also trains the first 3 steps
of "exact" (the fsdp4 spec under another name), which test_resume finishes in new processes,
and of "exact-moe" (moe-ep2's), which test_moe_resume finishes."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from fm_pipeline.data.testing import build_small_mix, small_job
from fm_pipeline.rundir.records import read_records
from fm_pipeline.storage import open_store
from tests.train.launch import BASE, failure, run_segments, write_job

# name -> overrides; all at 4 ranks (gbs 8, micro-batch 2).
LAYOUTS = {
    "fsdp4": {"parallelism.dp_shard": 4, "checkpoint.every_steps": 2},
    # (hsdp checkpoints at 4: test_resume continues it on other layouts.)
    "hsdp": {"parallelism.dp_replicate": 2, "parallelism.dp_shard": 2,
             "parallelism.activation_checkpoint": "selective", "checkpoint.every_steps": 4},
    "tp-fsdp": {"parallelism.tp": 2, "parallelism.dp_shard": 2,
                "parallelism.mixed_precision": "bf16", "training.micro_batch_size": 4},
    "tp-ddp": {"parallelism.tp": 2, "parallelism.dp_replicate": 2, "parallelism.dp_shard": 1,
               "training.micro_batch_size": 4},
    # Compiled blocks (training.compile) inside pipeline stages, FSDP and activation
    # checkpointing: the same first loss as the eager layouts, checked like them.
    "pp-1f1b-fsdp": {"parallelism.pp": 2, "parallelism.dp_shard": 2,
                     "parallelism.activation_checkpoint": "full", "training.compile": True},
    "pp-interleaved-fsdp": {"parallelism.pp": 2, "parallelism.dp_shard": 2,
                            "parallelism.pp_schedule": "Interleaved1F1B",
                            "parallelism.pp_virtual_stages": 2},
    # (These two and fp8-rowwise-tp checkpoint at 4: test_resume continues each on 2 ranks.)
    "pp-gpipe-tp": {"parallelism.pp": 2, "parallelism.tp": 2, "parallelism.dp_shard": 1,
                    "parallelism.pp_schedule": "GPipe", "checkpoint.every_steps": 4},
    "pp4-bf16": {"parallelism.pp": 4, "parallelism.dp_shard": 1,
                 "parallelism.mixed_precision": "bf16", "checkpoint.every_steps": 4},
    # FP8 linear layers (torchao): per-tensor scales with FP8 weight all-gathers under FSDP
    # (checkpoint at 8: test_fp8 resumes from it), per-row scales under TP.
    "fp8-fsdp4": {"parallelism.dp_shard": 4, "parallelism.mixed_precision": "fp8",
                  "checkpoint.every_steps": 4},
    "fp8-rowwise-tp": {"parallelism.tp": 2, "parallelism.dp_shard": 2,
                       "parallelism.mixed_precision": "fp8-rowwise",
                       "training.micro_batch_size": 4, "checkpoint.every_steps": 4},
    # A Mixture of Experts (8 experts, top 2) under FSDP, its balancing loss trained beside.
    "moe-fsdp4": {"model.size": "moe-debug", "parallelism.dp_shard": 4},
    # Expert parallel: the 8 experts over 2 ranks, FSDP-sharded over the other 2 (ep 2 x
    # dp_shard 2); and over all 4 ranks, with selective activation checkpointing.
    # (moe-ep2 checkpoints every 2 steps: the MoE resume tests continue from it.)
    "moe-ep2": {"model.size": "moe-debug", "parallelism.dp_shard": 4, "parallelism.ep": 2,
                "checkpoint.every_steps": 2},
    "moe-ep4": {"model.size": "moe-debug", "parallelism.dp_shard": 4, "parallelism.ep": 4,
                "parallelism.activation_checkpoint": "selective"},
    # Experts under a pipeline: 2 stages, the experts of each over 2 ranks (pp 2 x ep 2);
    # the balancing loss reaches the router through each stage's own backward.
    # (Checkpoint at 4: test_moe_resume resumes it without stages, on ep 4.)
    "moe-pp2-ep2": {"model.size": "moe-debug", "parallelism.pp": 2,
                    "parallelism.dp_shard": 2, "parallelism.ep": 2,
                    "checkpoint.every_steps": 4},
    # Balanced by DeepSeek-V3's routing bias instead of the auxiliary loss (checkpoint at 8).
    "moe-bias": {"model.size": "moe-debug", "model.moe_aux_loss_coef": 0.0,
                 "model.moe_bias_update_rate": 0.01, "parallelism.dp_shard": 4,
                 "parallelism.ep": 2, "checkpoint.every_steps": 8},
    # Uneven pipeline stages (Llama 3's first and last stage lighter): 6 layers over 4
    # stages as 1-2-2-1, beside the same 6-layer model under FSDP as its reference
    # (test_uneven_stages resumes the split's step-4 checkpoint on other layouts).
    "pp4-uneven": {"model.n_layers": 6, "parallelism.pp": 4, "parallelism.dp_shard": 1,
                   "parallelism.pp_layers_per_stage": [1, 2, 2, 1],
                   "checkpoint.every_steps": 4},
    "fsdp4-6l": {"model.n_layers": 6, "parallelism.dp_shard": 4},
}
SAME_MODEL = [name for name, overrides in LAYOUTS.items()
              if "model.size" not in overrides and "model.n_layers" not in overrides]


EXACT = "exact"  # the fsdp4 spec again, stopped after step 3, resumed by test_resume
EXACT_MOE = "exact-moe"  # moe-ep2 again, stopped after step 3, resumed by test_moe_resume


@dataclass
class Workspace:
    home: Path
    jobs: Path

    def metrics(self, job: str) -> list[dict]:
        return read_records(self.home / "runs" / job / "metrics.jsonl", "step")

    def segments(self, job: str) -> list[dict]:
        return read_records(self.home / "runs" / job / "segments.jsonl", "segment")

    def checkpoint(self, job: str, step: int) -> Path:
        return self.home / "runs" / job / "checkpoints" / f"step-{step:08d}"


@pytest.fixture(scope="session")
def workspace(tmp_path_factory) -> Workspace:
    home = tmp_path_factory.mktemp("trainer_home")
    jobs = home / "jobs"
    jobs.mkdir()
    with pytest.MonkeyPatch.context() as mp:  # the session fixture runs outside tests' FM_HOME
        mp.setenv("FM_HOME", str(home))
        build_small_mix(small_job(**BASE), store=open_store(str(home / "store")))
    return Workspace(home=home, jobs=jobs)


@pytest.fixture(scope="session")
def layouts_run(workspace) -> Workspace:
    segments = [str(write_job(workspace.jobs, name, nproc=4, **overrides))
                for name, overrides in LAYOUTS.items()]
    exact = write_job(workspace.jobs, EXACT, nproc=4, **LAYOUTS["fsdp4"])
    exact_moe = write_job(workspace.jobs, EXACT_MOE, nproc=4, **LAYOUTS["moe-ep2"])
    out = run_segments(workspace.home, [*segments, f"{exact}@3", f"{exact_moe}@3"], nproc=4)
    assert out.returncode == 0, failure(out)
    return workspace
