"""The fast tier's node keeper: runs whose files stopped changing for longer than idle_s are
deleted whole, live ones are kept with their size, on real files."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from fm_pipeline.checkpoint.fast_keeper import sweep


def _run(root, job, run, *, age_s: float, mib: int = 1):
    d = root / job / run
    for sub in ("own/rank-00000", "progress"):
        (d / sub).mkdir(parents=True, exist_ok=True)
    snap = d / "own/rank-00000/step-00000004.snap"
    snap.write_bytes(b"\0" * (mib << 20))
    progress = d / "progress/rank-00000"
    progress.write_text("4")
    at = time.time() - age_s
    for path in (snap, progress, *d.rglob("*"), d):
        os.utime(path, (at, at))
    return d


def test_idle_runs_are_removed_and_live_ones_kept(tmp_path):
    gone = _run(tmp_path, "llama", "failed-run", age_s=7200, mib=2)
    live = _run(tmp_path, "llama", "live-run", age_s=5)
    other = _run(tmp_path, "moe", "old", age_s=4000)
    # One fresh progress write keeps a run alive, however old its snapshots are.
    stale_snaps = _run(tmp_path, "moe", "slow", age_s=9000)
    (stale_snaps / "progress/rank-00000").write_text("5")

    result = sweep(tmp_path, idle_s=3600)
    assert not gone.exists() and not other.exists()
    assert live.exists() and stale_snaps.exists()
    assert sorted(r for r, _, _ in result.removed) == ["llama/failed-run", "moe/old"]
    assert dict((r, b) for r, b, _ in result.removed)["llama/failed-run"] >= 2 << 20
    assert result.held_bytes >= 2 << 20 and "2 idle run(s) removed" in result.line()
    assert (tmp_path / "moe").exists()  # still holds a live run
    _run(tmp_path, "done", "r", age_s=7200)
    sweep(tmp_path, idle_s=3600)
    assert not (tmp_path / "done").exists()  # an emptied job directory goes too


def test_the_keeper_command_sweeps_once_and_refuses_bad_settings(tmp_path):
    _run(tmp_path, "llama", "failed-run", age_s=7200)
    cmd = [sys.executable, "-m", "fm_pipeline.checkpoint.fast_keeper", "--root", str(tmp_path)]
    out = subprocess.run([*cmd, "--once"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "1 idle run(s) removed" in out.stdout and not (tmp_path / "llama").exists()
    bad = subprocess.run([*cmd, "--idle-s", "0"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "--idle-s and --every-s must be > 0" in bad.stderr
