"""Each worker counts the worker groups its agent started (every rendezvous round), which
torch's TORCHELASTIC_RESTART_COUNT does not do for rounds a membership change starts."""

from __future__ import annotations

from fm_pipeline.rundir.attempts import worker_group_start


def test_each_start_of_a_local_rank_is_counted_per_run(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job.v2-7")  # dots and dashes in a run id
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "0")  # torch counted no failure
    for local in ("0", "1"):
        monkeypatch.setenv("LOCAL_RANK", local)
        assert [worker_group_start(tmp_path) for _ in range(3)] == [0, 1, 2]
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "another-run")
    assert worker_group_start(tmp_path) == 0


def test_a_dead_agents_counts_are_forgotten_when_a_new_one_starts(tmp_path, monkeypatch):
    starts = tmp_path / ".starts"
    starts.mkdir()
    (starts / "old-run-4194305-0").write_text("5")  # beyond pid_max: no such agent
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "run")
    monkeypatch.setenv("LOCAL_RANK", "0")
    assert worker_group_start(tmp_path) == 0
    assert [p.name for p in starts.iterdir()] == [next(starts.glob("run-*")).name]


def test_outside_torchrun_or_without_node_memory_it_is_torchs_count(tmp_path, monkeypatch):
    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "2")
    assert worker_group_start(tmp_path) == 2
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "run")
    blocked = tmp_path / "file"
    blocked.write_text("")  # a file where the directory would be: nowhere to count
    assert worker_group_start(blocked) == 2
