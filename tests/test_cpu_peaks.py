"""The CPU's matmul peaks are measured once per host and thread count, then read back by
every process that needs them (trainer ranks, the planner in each Dagster run)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from fm_pipeline import cpu_peaks
from fm_pipeline.accelerators import measured_cpu
from fm_pipeline.planner.cluster import cpu_per_rank


@pytest.fixture(autouse=True)
def own_cache(monkeypatch, tmp_path):
    """These tests measure: a cache directory of their own (the default place under
    XDG_CACHE_HOME), not the session's shared file."""
    monkeypatch.delenv(cpu_peaks.CACHE_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))


def test_the_shared_file_is_used_where_it_is_named(tmp_path, monkeypatch):
    monkeypatch.setenv(cpu_peaks.CACHE_ENV, str(tmp_path / "peaks.json"))
    cpu_peaks.cpu_peak("fp32", threads=1)
    assert cpu_peaks.cache_path() == tmp_path / "peaks.json"
    assert len(json.loads((tmp_path / "peaks.json").read_text())) == 1


def _count_probes(monkeypatch) -> list[str]:
    probes: list[str] = []
    real = cpu_peaks.measure_matmul_flops
    monkeypatch.setattr(cpu_peaks, "measure_matmul_flops",
                        lambda dtype="fp32", **kw: probes.append(dtype) or real(dtype, **kw))
    return probes


def test_a_peak_is_measured_once_and_read_back(fm_home, monkeypatch):
    probes = _count_probes(monkeypatch)
    first = cpu_peaks.cpu_peak("fp32", threads=1)
    assert probes == ["fp32"] and 1e8 < first < 1e13
    assert cpu_peaks.cpu_peak("fp32", threads=1) == first and probes == ["fp32"]
    cpu_peaks.cpu_peak("fp32", threads=2)  # another thread count is another measurement
    assert probes == ["fp32", "fp32"]
    entries = json.loads(cpu_peaks.cache_path().read_text())
    assert len(entries) == 2 and all("measured_at" in e for e in entries.values())
    assert any("|1t|" in k for k in entries) and any("|2t|" in k for k in entries)


def test_another_process_reads_the_peak_this_one_measured(fm_home, monkeypatch):
    mine = cpu_peaks.cpu_peak("fp32", threads=1)
    code = ("import fm_pipeline.cpu_peaks as c\n"
            "c.measure_matmul_flops = lambda *x, **k: (_ for _ in ()).throw(AssertionError)\n"
            "print(c.cpu_peak('fp32', threads=1))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert float(out.stdout) == mine


def test_the_planner_and_the_trainer_use_the_same_figure(fm_home, monkeypatch):
    """A 2-rank CPU job on this machine: the planner's per-rank entry is the peak the
    trainer's ranks (cores // 2 threads each) read for their MFU."""
    import os

    import fm_pipeline.accelerators as acc

    monkeypatch.setattr(acc, "_cpu_cache", {})  # this process's, from another FM_HOME

    threads = max(1, (os.cpu_count() or 1) // 2)
    entry = cpu_per_rank(2)
    assert entry.name == f"cpu-{threads}t"
    assert entry.peak_fp32_flops == cpu_peaks.cpu_peak("fp32", threads=threads)
    assert measured_cpu(threads) is measured_cpu(threads)


def test_a_corrupt_cache_is_measured_again_and_replaced(fm_home, monkeypatch):
    cpu_peaks.cache_path().parent.mkdir(parents=True)
    cpu_peaks.cache_path().write_text("{not json")
    probes = _count_probes(monkeypatch)
    assert cpu_peaks.cpu_peak("fp32", threads=1) > 0 and probes == ["fp32"]
    assert len(json.loads(cpu_peaks.cache_path().read_text())) == 1
