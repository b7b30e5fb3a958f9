"""A dev cluster whose component finds its port taken (chosen at the start of `up`, bound
up to half a minute later) starts again on other ports, at most START_ATTEMPTS times; any
other start-up failure is raised at once. The ports come from below the ephemeral range
(tests/resilience/test_ports.py); this is the loop around them."""

from __future__ import annotations

import pytest

from fm_pipeline.devcluster import processes
from fm_pipeline.devcluster.cluster import DevCluster

TAKEN = processes.ComponentFailed(
    "the jobset manager exited with 1 while starting; the end of jobset.log:\n"
    "listen tcp 127.0.0.1:29381: bind: address already in use")


def _cluster(tmp_path, monkeypatch, outcomes: list):
    dev = DevCluster(None, tmp_path, nodes=[], tenants=None)
    calls: list[int] = []

    def fake_up(progress):
        calls.append(1)
        outcome = outcomes[len(calls) - 1]
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    monkeypatch.setattr(dev, "_up", fake_up)
    return dev, calls


def test_a_taken_port_starts_the_cluster_again(tmp_path, monkeypatch):
    dev, calls = _cluster(tmp_path, monkeypatch, [TAKEN, "up"])
    said: list[str] = []
    assert dev.up(said.append) == "up" and len(calls) == 2
    assert any("starting again on other ports" in s and "29381" not in s.split(";")[1]
               for s in said), said


def test_it_gives_up_after_its_attempts_and_other_failures_are_not_retried(tmp_path,
                                                                          monkeypatch):
    dev, calls = _cluster(tmp_path, monkeypatch, [TAKEN] * DevCluster.START_ATTEMPTS)
    with pytest.raises(processes.ComponentFailed, match="address already in use"):
        dev.up()
    assert len(calls) == DevCluster.START_ATTEMPTS
    broken = processes.ComponentFailed("kube-apiserver not ready after 60 s")
    dev, calls = _cluster(tmp_path, monkeypatch, [broken, "up"])
    with pytest.raises(processes.ComponentFailed, match="not ready"):
        dev.up()
    assert len(calls) == 1
