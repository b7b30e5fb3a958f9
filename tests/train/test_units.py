"""The trainer's pieces that need no process group: LR schedule, gradient norm, train state,
preemption flag, metrics records, CLI parsing and the elastic world-size rule."""

from __future__ import annotations

import math
import os
import signal
import time

import pytest
import torch
import yaml

from fm_pipeline.config import JobSpecError, dump_job
from fm_pipeline.data.testing import small_job
from fm_pipeline.rundir.records import JsonLines, read_records
from fm_pipeline.train.__main__ import load_job_for_world, parse_overrides
from fm_pipeline.train.grad_norm import clip_grads_, global_grad_norm
from fm_pipeline.train.metrics import mfu
from fm_pipeline.train.optimizer import lr_factor
from fm_pipeline.train.preemption import PreemptionWatcher
from fm_pipeline.train.segment import SegmentSetupError, segment_target
from fm_pipeline.train.state import TrainState


def test_lr_warms_up_linearly_then_decays_by_cosine_to_min_lr():
    t = small_job(**{"training.steps": 100, "training.warmup_steps": 10, "training.lr": 1e-3,
                     "training.min_lr": 1e-4}).training
    lrs = [t.lr * lr_factor(i, t) for i in range(100)]
    assert lrs[0] == pytest.approx(1e-4) and lrs[9] == pytest.approx(1e-3)
    assert all(a > b for a, b in zip(lrs[10:], lrs[11:]))  # strictly decaying after warmup
    assert t.lr * lr_factor(100, t) == pytest.approx(1e-4)
    assert lrs[55] == pytest.approx(1e-4 + 0.9e-3 * 0.5 * (1 + math.cos(math.pi * 0.5)))


def test_grad_norm_is_the_float64_norm_of_all_gradients_and_clipping_caps_it():
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(300, 200)) for _ in range(3)]
    for p in params:
        p.grad = torch.randn_like(p) * 10
    expected = torch.cat([p.grad.double().flatten() for p in params]).norm()
    norm = global_grad_norm(params)
    assert norm.dtype == torch.float64 and norm.item() == pytest.approx(expected.item(), rel=1e-6)
    clip_grads_(params, max_norm=1.0, total_norm=norm)
    assert global_grad_norm(params).item() == pytest.approx(1.0, rel=1e-5)


def test_train_state_skips_rng_of_another_topology_and_reseeds_deterministically():
    state = TrainState(rank=1, topology="world2:a", seed=7, device=torch.device("cpu"))
    assert "rng.rank1" in state.state_dict()
    with state.restoring_from("world4:b"):
        keys = state.state_dict()
        assert "rng.rank1" not in keys  # a load from world 4 must not ask for it
        state.load_state_dict({"step": 5, "tokens_seen": 80, "topology": "world4:b"})
    assert state.step == 5 and not state.rng_restored
    after_reseed = torch.rand(3)
    state.reseed()
    assert torch.equal(torch.rand(3), after_reseed)  # reseeding is a function of (seed, step, rank)
    assert "rng.rank1" in state.state_dict()  # saves always carry it again
    with state.restoring_from("world2:a"):
        saved = state.state_dict()
        expected = torch.rand(2)
        state.load_state_dict(saved)
    assert state.rng_restored and torch.equal(torch.rand(2), expected)


def test_preemption_by_signal_sets_a_flag_and_handlers_are_restored(tmp_path):
    before = signal.getsignal(signal.SIGTERM)
    watcher = PreemptionWatcher(tmp_path / "PREEMPT")
    assert not watcher.requested()
    os.kill(os.getpid(), signal.SIGTERM)
    assert watcher.requested() and watcher.reason == "signal SIGTERM"
    watcher.close()
    assert signal.getsignal(signal.SIGTERM) == before


def test_preemption_flag_file_counts_only_when_newer_than_the_process(tmp_path):
    flag = tmp_path / "PREEMPT"
    flag.touch()
    # Left over from an earlier segment: older than this process (a day: the suite itself
    # can run past an hour, and an hour-old flag was then newer than the process).
    old = time.time() - 86400
    os.utime(flag, (old, old))
    watcher = PreemptionWatcher(flag, signals=())
    assert not watcher.requested() and not flag.exists()
    flag.touch()
    assert watcher.requested() and "flag file" in watcher.reason
    watcher.consume_flag_file()
    assert not flag.exists()


def test_mfu_is_model_flops_over_device_peak():
    assert mfu(flops_per_token=6e9, tokens=1000, step_time_s=2.0, devices=4,
               peak_flops=1e12) == pytest.approx(0.75)
    assert mfu(flops_per_token=6e9, tokens=1000, step_time_s=2.0, devices=4,
               peak_flops=None) is None


def test_metrics_records_carry_kind_job_segment_and_survive_a_torn_line(tmp_path):
    lines = JsonLines(tmp_path / "m.jsonl", job="j", segment="s1")
    lines.write("step", step=1, loss=torch.tensor(2.5))
    lines.close()
    with open(tmp_path / "m.jsonl", "a") as f:
        f.write('{"kind": "step", "ste')  # a writer killed mid-line
    (record,) = read_records(tmp_path / "m.jsonl", "step")
    assert record["job"] == "j" and record["segment"] == "s1" and record["loss"] == 2.5


def test_segment_ends_at_the_next_segment_boundary_capped_at_the_target():
    job = small_job(**{"training.steps": 50, "training.segment_steps": 20})
    assert [segment_target(job, s, None) for s in (0, 19, 20, 45)] == [20, 20, 40, 50]
    assert segment_target(job, 3, 7) == 7
    with pytest.raises(SegmentSetupError, match="--end-step 60 exceeds training.steps"):
        segment_target(job, 0, 60)


def test_set_overrides_parse_yaml_values():
    assert parse_overrides(["training.lr=1e-3", "name=abc", "checkpoint.upload=false"]) == {
        "training.lr": 1e-3, "name": "abc", "checkpoint.upload": False}
    with pytest.raises(JobSpecError):
        parse_overrides(["training.lr"])


def _job_file(tmp_path, **parallelism):
    data = dump_job(small_job())
    data["parallelism"] = parallelism
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_an_elastic_world_rederives_dp_shard_when_the_job_lets_it(tmp_path):
    path = _job_file(tmp_path, nproc_per_node=4, tp=2)  # dp_shard unset: inferred
    job = load_job_for_world(path, {}, world_size=2, local_world_size=2)
    assert (job.parallelism.resolved_dp_shard, job.parallelism.tp,
            job.parallelism.world_size) == (1, 2, 2)


def test_a_world_size_the_degrees_do_not_allow_is_a_bad_config_naming_them(tmp_path):
    path = _job_file(tmp_path, nproc_per_node=4, dp_shard=2, tp=2)
    with pytest.raises(JobSpecError) as e:
        load_job_for_world(path, {}, world_size=2, local_world_size=2)
    assert "dp_shard 2 x pp 1 x tp 2 = 4 ranks, but torchrun started 2" in str(e.value)


def test_resume_from_accepts_a_checkpoint_directory_or_a_store_location(tmp_path):
    from fm_pipeline.catalog.refs import ref_from_location
    from fm_pipeline.storage import open_store

    store = open_store(str(tmp_path / "store"))
    local = tmp_path / "runs" / "j" / "checkpoints" / "step-00000004"
    local.mkdir(parents=True)
    assert ref_from_location(str(local), store).is_local
    remote = ref_from_location(f"{store.uri}/checkpoints/j/step-00000004", store)
    assert not remote.is_local and remote.prefix == "checkpoints/j/step-00000004"
    with pytest.raises(ValueError, match="neither a checkpoint directory"):
        ref_from_location(str(tmp_path / "nowhere"), store)
