"""The job lease's rules on both kinds of store (a directory, and S3 on loopback with real
conditional writes): one holder at a time, named when refused; a dead holder taken over
(at once on this host, after expiry elsewhere), recorded; a taken-over holder learns it."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from fm_pipeline.rundir.lease import JobLease, LeaseHeld, LeaseLost, LeaseUnavailable, store_key
from fm_pipeline.storage import open_store
from tests import local_site


@pytest.fixture(params=["local", "s3"])
def store(request, tmp_path):
    if request.param == "local":
        return open_store(tmp_path / "store")
    bucket = request.getfixturevalue("s3_bucket")
    return local_site.site().open_store(f"s3://{bucket}/fm")


def _lease(store, tmp_path, node: str, *, ttl_s: float = 60.0, host: str | None = None):
    """A holder with its own run directory (another node's disk); `host` pretends another
    machine, for the rules that depend on it."""
    lease = JobLease("job-a", store=store, ttl_s=ttl_s, run_dir=tmp_path / node / "run")
    if host is not None:
        lease.host = host
    return lease


def test_second_holder_is_refused_naming_the_first_then_takes_it_after_release(store,
                                                                              tmp_path):
    first = _lease(store, tmp_path, "a").acquire()
    with pytest.raises(LeaseHeld) as refused:
        _lease(store, tmp_path, "b").acquire()
    message = str(refused.value)
    assert first.holder in message and f"pid {first.pid}" in message and first.host in message
    first.release()
    second = _lease(store, tmp_path, "b").acquire()
    record = json.loads(store.get_bytes(store_key("job-a")))
    assert record["holder"] == second.holder and record["taken_over"] is None
    second.release()
    assert not store.exists(store_key("job-a"))


def test_same_run_directory_is_refused_by_the_local_lock(tmp_path):
    first = JobLease("job-a", store=None, run_dir=tmp_path / "run").acquire()
    with pytest.raises(LeaseHeld, match=first.holder):
        JobLease("job-a", store=None, run_dir=tmp_path / "run").acquire()
    first.release()


def test_a_live_holder_elsewhere_is_refused_once_it_renews(store, tmp_path):
    first = _lease(store, tmp_path, "a", host="node-a", ttl_s=6.0).acquire()
    first.start_heartbeat(on_lost=lambda why: None)
    t0 = time.monotonic()
    with pytest.raises(LeaseHeld, match="node-a"):
        _lease(store, tmp_path, "b").acquire()
    assert time.monotonic() - t0 < first.ttl_s  # proven alive by a renewal, not by expiry
    first.release()


def test_a_silent_holder_elsewhere_is_taken_over_after_it_expires(store, tmp_path):
    dead = _lease(store, tmp_path, "a", host="node-a", ttl_s=3.0).acquire()  # never renews
    t0 = time.monotonic()
    second = _lease(store, tmp_path, "b").acquire()
    waited = time.monotonic() - t0
    assert dead.ttl_s - 1.0 < waited < dead.ttl_s + 2.5, waited
    assert second.taken_over["holder"] == dead.holder
    assert "did not renew" in second.taken_over["why"]
    record = json.loads(store.get_bytes(store_key("job-a")))
    assert record["holder"] == second.holder and record["taken_over"]["holder"] == dead.holder
    with pytest.raises(LeaseLost, match="taken over"):  # the old holder cannot commit
        dead.confirm()
    dead.release()  # must not delete the new holder's lease
    assert json.loads(store.get_bytes(store_key("job-a")))["holder"] == second.holder
    second.release()


@pytest.mark.parametrize("skew_s", [120.0, -120.0])
def test_a_contender_whose_clock_is_off_neither_takes_a_live_lease_nor_waits_longer(
        store, tmp_path, skew_s):
    # A host whose wall clock runs 120 s ahead used to read the live holder's record as
    # "expired 91 s ago" and take it at once; one running behind waited 120 s too long.
    live = _lease(store, tmp_path, "a", host="node-a", ttl_s=3.0).acquire()
    live.start_heartbeat(on_lost=lambda why: None)
    skewed = JobLease("job-a", store=store, ttl_s=3.0, run_dir=tmp_path / "b" / "run",
                      clock=lambda: time.time() + skew_s)
    with pytest.raises(LeaseHeld, match="node-a"):
        skewed.acquire()
    assert live.lost is None
    live.confirm()  # still the holder: it may commit
    live.release()

    silent = _lease(store, tmp_path, "c", host="node-c", ttl_s=3.0).acquire()  # never renews
    t0 = time.monotonic()
    taker = JobLease("job-a", store=store, ttl_s=3.0, run_dir=tmp_path / "d" / "run",
                     clock=lambda: time.time() + skew_s).acquire()
    assert silent.ttl_s - 0.5 < time.monotonic() - t0 < silent.ttl_s + 2.5
    assert taker.taken_over["holder"] == silent.holder
    taker.release()


def test_a_dead_process_on_this_host_is_taken_over_at_once(store, tmp_path):
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    dead = _lease(store, tmp_path, "a", ttl_s=600).acquire()
    dead.pid = int(gone.stdout)  # its record now names a process that has exited
    dead.confirm()
    t0 = time.monotonic()
    second = _lease(store, tmp_path, "b", ttl_s=600).acquire()
    assert time.monotonic() - t0 < 5
    assert second.taken_over["pid"] == int(gone.stdout)
    assert "gone" in second.taken_over["why"]
    second.release()


def test_an_unreachable_store_is_an_error_after_one_ttl(tmp_path, monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "x")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "x")
    from fm_pipeline.storage.s3 import S3Store

    closed = S3Store("s3://nobody/fm", endpoint_url="http://127.0.0.1:9", max_attempts=1,
                     connect_timeout_s=0.2)
    t0 = time.monotonic()
    with pytest.raises(LeaseUnavailable, match="could not be checked for 1 s"):
        JobLease("job-a", store=closed, ttl_s=1.0, run_dir=tmp_path / "run").acquire()
    assert time.monotonic() - t0 < 10
    # The local lock was given back: a later attempt is not refused by it.
    JobLease("job-a", store=None, run_dir=tmp_path / "run").acquire().release()


def test_a_store_that_ignores_conditional_writes_is_refused_naming_it(s3_bucket, s3_endpoint,
                                                                      tmp_path):
    from fm_pipeline.rundir import lease as lease_module
    from fm_pipeline.rundir.lease import StoreIgnoresConditions, probe_conditional_writes
    from fm_pipeline.storage.s3 import S3Store
    from tests.storage.dropping_proxy import DroppingProxy

    lease_module._PROBED.clear()
    honest = S3Store(f"s3://{s3_bucket}/fm", endpoint_url=s3_endpoint)
    probe_conditional_writes(honest, "job-a")  # moto honours them: nothing raised
    assert not [o for o in honest.list("checkpoints/") if "lease-probe" in o.key]
    with DroppingProxy(s3_endpoint) as proxy:
        blind = S3Store(f"s3://{s3_bucket}/blind", endpoint_url=proxy.url)
        with pytest.raises(StoreIgnoresConditions) as refused:
            JobLease("job-a", store=blind, ttl_s=5.0, run_dir=tmp_path / "run").acquire()
        assert proxy.dropped >= 2
    message = str(refused.value)
    assert f"s3://{s3_bucket}/blind" in message and "If-None-Match" in message
    assert "If-Match with a wrong etag" in message
    # Nothing was taken: no lease object, and the local lock was given back.
    behind = S3Store(f"s3://{s3_bucket}/blind", endpoint_url=s3_endpoint)  # the same bucket
    assert [o.key for o in behind.list("checkpoints/")] == []  # no lease, no probe left
    JobLease("job-a", store=None, run_dir=tmp_path / "run").acquire().release()
