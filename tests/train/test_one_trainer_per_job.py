"""One live segment per job: two `torchrun -m fm_pipeline.train` on one job at once, as users
start them. Exactly one trains; the other exits with the lease-held code naming the holder,
having written nothing. On one machine (the run directory's lock), across nodes that share
only S3 (the store's conditional-write lease), and after a holder on another host is killed:
its lease expires and the next segment takes it over, recorded, and resumes its checkpoint.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import pytest

from fm_pipeline.config import load_job
from fm_pipeline.data.testing import build_small_mix
from fm_pipeline.rundir.lease import store_key
from fm_pipeline.rundir.records import read_records
from fm_pipeline.storage import open_store
from tests.conftest import REPO
from tests.train.launch import env_for, failure, torchrun_cmd, write_job
from tests import local_site

pytestmark = pytest.mark.slow

SLOW = {"FM_FAULT_SLOW_RANKS": "0:1.0"}  # ~1 s a step: the holder is still training


def _start(job_path, env, *, host: str | None = None) -> subprocess.Popen:
    cmd = torchrun_cmd(1, "-m", "fm_pipeline.train", "--job", str(job_path))
    if host is not None:  # another machine: its own hostname (a UTS namespace), which
        # resolves nowhere, so the rendezvous and gloo use loopback
        cmd = ["unshare", "--uts", "--", "sh", "-c", f'hostname {host} && exec "$@"', "sh",
               *cmd[:3], "--local-addr=127.0.0.1", *cmd[3:]]
        env = {**env, "GLOO_SOCKET_IFNAME": "lo"}
    return subprocess.Popen(cmd, env=env, cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


def _wait_for(predicate, timeout_s: float = 120.0, what: str = "condition"):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if (value := predicate()):
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def _finish(proc: subprocess.Popen, timeout_s: float = 300) -> subprocess.CompletedProcess:
    out, err = proc.communicate(timeout=timeout_s)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def _steps(home, job) -> list[int]:
    return [r["step"] for r in read_records(home / "runs" / job / "metrics.jsonl", "step")]


def _job(tmp_path, name, **overrides):
    path = write_job(tmp_path, name, nproc=1, **{
        "training.steps": 16, "training.segment_steps": 16, "checkpoint.every_steps": 4,
        **overrides})
    return path, load_job(path)


def _assert_refused(out: subprocess.CompletedProcess, holder: dict) -> None:
    text = out.stdout + out.stderr
    assert out.returncode != 0, text[-2000:]
    assert "exitcode  : 3" in text or "exitcode : 3" in text, text[-3000:]
    assert "is already being trained" in text and holder["holder"] in text
    assert f"pid {holder['pid']}" in text


def test_a_second_trainer_on_the_same_machine_is_refused_naming_the_first(fm_home, tmp_path):
    path, job = _job(tmp_path, "lease-local")
    build_small_mix(job, store=open_store(fm_home / "store"))
    record = fm_home / "runs" / job.name / "lease.json"
    first = _start(path, env_for(fm_home, **SLOW))
    try:
        holder = _wait_for(lambda: record.is_file() and json.loads(record.read_text()),
                           what="the first trainer's lease")
        _wait_for(lambda: _steps(fm_home, job.name), what="the first trainer's first step")
        second = _finish(_start(path, env_for(fm_home)))
        _assert_refused(second, holder)
    finally:
        done = _finish(first)
    assert done.returncode == 0, failure(done)
    assert _steps(fm_home, job.name) == list(range(1, 17))  # one trainer's steps, once each
    segments = read_records(fm_home / "runs" / job.name / "segments.jsonl", "segment")
    assert len(segments) == 1 and segments[0]["lease"]["holder"] == holder["holder"]
    assert not record.exists()  # released at exit


def test_nodes_sharing_only_s3_are_refused_by_the_store_lease(fm_home, tmp_path, s3_bucket):
    store_uri = f"s3://{s3_bucket}/fm"
    s3 = {"FM_STORE_URI": store_uri, "FM_S3_ENDPOINT_URL": os.environ["FM_S3_ENDPOINT_URL"]}
    path, job = _job(tmp_path, "lease-s3", **{"checkpoint.upload": True})
    store = local_site.site().open_store(store_uri)
    build_small_mix(job, store=store)
    other_home = tmp_path / "node-b"  # its own disk: only the store is shared
    first = _start(path, env_for(fm_home, **s3, **SLOW))
    try:
        _wait_for(lambda: _steps(fm_home, job.name), what="the first trainer's first step")
        holder = json.loads(store.get_bytes(store_key(job.name)))
        second = _finish(_start(path, env_for(other_home, **s3)))
        _assert_refused(second, holder)
        assert "s3://" in second.stdout + second.stderr  # the lease it met: the store's
        assert not (other_home / "runs" / job.name / "checkpoints").exists()
    finally:
        done = _finish(first)
    assert done.returncode == 0, failure(done)
    assert not store.exists(store_key(job.name))


def test_a_killed_holder_elsewhere_is_taken_over_after_expiry_and_resumed(fm_home, tmp_path,
                                                                           s3_bucket):
    store_uri = f"s3://{s3_bucket}/fm"
    s3 = {"FM_STORE_URI": store_uri, "FM_S3_ENDPOINT_URL": os.environ["FM_S3_ENDPOINT_URL"]}
    path, job = _job(tmp_path, "lease-takeover", **{
        "checkpoint.upload": True, "resilience.lease_ttl_s": 6.0})
    store = local_site.site().open_store(store_uri)
    build_small_mix(job, store=store)
    first = _start(path, env_for(fm_home, **s3, **SLOW), host="node-a")
    ckpt4 = f"checkpoints/{job.name}/step-00000004/manifest.json"
    _wait_for(lambda: store.exists(ckpt4), what="step 4 committed to the store")
    holder = json.loads(store.get_bytes(store_key(job.name)))
    assert holder["host"] == "node-a"
    # The node is gone: agent and worker (torchrun gives workers their own process group)
    # die at once, no release, no goodbye.
    os.killpg(first.pid, signal.SIGKILL)
    os.kill(holder["pid"], signal.SIGKILL)
    first.wait()

    other_home = tmp_path / "node-b"
    t0 = time.monotonic()
    second = _finish(_start(path, env_for(other_home, **s3), host="node-b"))
    assert second.returncode == 0, failure(second)
    assert time.monotonic() - t0 > 2.0  # it waited for the expiry: node-a never renewed
    (segment,) = read_records(other_home / "runs" / job.name / "segments.jsonl", "segment")
    taken = segment["lease"]["taken_over"]
    # Silence observed for the holder's whole TTL on node-b's own clock (rundir/lease.py).
    assert taken["holder"] == holder["holder"] and "did not renew" in taken["why"]
    assert segment["start_step"] >= 4 and segment["end_step"] == 16
    assert not store.exists(store_key(job.name))


def test_a_store_that_ignores_conditional_writes_is_refused_before_training(fm_home, tmp_path,
                                                                            s3_bucket):
    # The same bucket behind a gateway that drops If-None-Match / If-Match: two trainers
    # could both take the lease there, so none trains on it.
    from tests.storage.dropping_proxy import DroppingProxy

    store_uri = f"s3://{s3_bucket}/fm"
    path, job = _job(tmp_path, "lease-blind", **{"checkpoint.upload": True})
    build_small_mix(job, store=local_site.site().open_store(store_uri))
    with DroppingProxy(os.environ["FM_S3_ENDPOINT_URL"]) as proxy:
        out = _finish(_start(path, env_for(fm_home, FM_STORE_URI=store_uri,
                                           FM_S3_ENDPOINT_URL=proxy.url)))
    text = out.stdout + out.stderr
    assert out.returncode != 0, text[-2000:]
    assert "exitcode  : 2" in text or "exitcode : 2" in text, text[-3000:]  # bad config
    assert "ignores S3 conditional writes" in text and store_uri in text
    assert _steps(fm_home, job.name) == []  # not one step
    assert not (fm_home / "runs" / job.name / "checkpoints").exists()
    assert [o.key for o in local_site.site().open_store(store_uri).list(f"checkpoints/{job.name}/")] == []
