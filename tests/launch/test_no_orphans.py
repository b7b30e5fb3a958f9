"""No process outlives its segment: each worker starts a helper in a session of its own that
ignores SIGTERM (as a leaked data-loader or compile worker would); however the segment ends
(finished, preempted, timed out, its launcher interrupted, its launcher SIGKILLed), the
no process started for it is left afterwards."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from fm_pipeline.launch.local import run_segment_locally
from fm_pipeline.launch.outcome import Outcome
from fm_pipeline.launch.reaper import reap_orphans
from fm_pipeline.launch.spec import SegmentLaunch
from tests.launch.conftest import TINY_WORKER
from tests import local_site

pytestmark = pytest.mark.slow


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def segment_processes(out: Path) -> set[int]:
    """Every live process started for this test's segment (torchrun, workers, helpers): the
    ones whose environment carries its FM_TINY_OUT, read from /proc independently of the
    launcher's own bookkeeping."""
    marker = f"FM_TINY_OUT={out}".encode()
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                environ = (entry / "environ").read_bytes().split(b"\0")
            except OSError:
                continue
            if marker in environ and alive(int(entry.name)):
                found.add(int(entry.name))
    return found


def helpers(out: Path, n: int = 2, timeout_s: float = 120) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while len(list(out.glob("helper*"))) < n and time.monotonic() < deadline:
        time.sleep(0.1)
    return [int(p.read_text()) for p in sorted(out.glob("helper*"))]


@pytest.fixture
def out(tmp_path, monkeypatch):
    path = tmp_path / "out"
    path.mkdir()
    monkeypatch.setenv("FM_TINY_OUT", str(path))
    return path


def _run(job2, monkeypatch, behaviour: str, **kwargs):
    monkeypatch.setenv("FM_TINY_WORKER", behaviour)
    return run_segment_locally(SegmentLaunch(job2, end_step=5, module=TINY_WORKER), echo=None,
                               **kwargs, site=local_site.site())


def test_a_finished_segment_leaves_no_process(job2, monkeypatch, out):
    assert not segment_processes(out)
    result = _run(job2, monkeypatch, "helper+ok", timeout_s=120)
    assert result.outcome is Outcome.SUCCEEDED
    spawned = helpers(out)
    assert len(spawned) == 2 and not any(alive(p) for p in spawned)
    assert not segment_processes(out)
    assert "ended 2 process(es) left after torchrun exited" in Path(
        result.output_log).read_text()


def test_a_preempted_segment_leaves_no_process(job2, monkeypatch, out):
    preempt = threading.Event()
    threading.Thread(target=lambda: (helpers(out), time.sleep(1.0), preempt.set()),
                     daemon=True).start()
    result = _run(job2, monkeypatch, "helper+preempt", timeout_s=120, preempt=preempt)
    assert result.outcome is Outcome.PREEMPTED
    assert not any(alive(p) for p in helpers(out))
    assert not segment_processes(out)


def test_a_timed_out_segment_leaves_no_process(job2, monkeypatch, out):
    assert not segment_processes(out)
    result = _run(job2, monkeypatch, "helper+preempt", timeout_s=8)
    assert result.outcome is Outcome.TIMED_OUT
    assert not any(alive(p) for p in helpers(out))
    assert not segment_processes(out)


LAUNCHER = textwrap.dedent("""
    import sys
    from fm_pipeline.launch.local import run_segment_locally
    from fm_pipeline.launch.spec import SegmentLaunch
    from tests import local_site
    from tests.launch.conftest import TINY_WORKER, tiny_job

    run_segment_locally(SegmentLaunch(tiny_job(), end_step=5, module=TINY_WORKER), echo=None,
                        timeout_s=300, site=local_site.site())
""")


@pytest.mark.parametrize("how", ["interrupted", "sigkilled"])
def test_a_launcher_interrupted_or_killed_leaves_no_process(monkeypatch, out, tmp_path, how):
    # The launcher as a Dagster run worker or `fm api serve` runs it: a process of its own.
    # Interrupted (a run terminated from the UI or the API: SIGINT/SIGTERM) it stops the
    # segment itself; SIGKILLed, torchrun gets SIGTERM from the kernel and the next launch
    # on the machine (here: reap_orphans, what each launch and `fm api serve` run first)
    # ends what is left.
    assert not segment_processes(out)
    env = {**os.environ, "FM_TINY_WORKER": "helper+preempt", "FM_TINY_OUT": str(out),
           "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER], env=env, cwd=tmp_path,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    spawned = helpers(out)
    assert len(spawned) == 2 and all(alive(p) for p in spawned)
    launcher.send_signal(signal.SIGINT if how == "interrupted" else signal.SIGKILL)
    launcher.wait(timeout=120)
    if how == "sigkilled":
        deadline = time.monotonic() + 60  # torchrun stops its workers (PDEATHSIG -> SIGTERM)
        while segment_processes(out) - set(spawned) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert all(alive(p) for p in spawned)  # the helpers outlived everything above them
        assert set(spawned) <= set(reap_orphans(grace_s=2))
    deadline = time.monotonic() + 30
    while segment_processes(out) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not segment_processes(out)
    assert not any(alive(p) for p in spawned)
