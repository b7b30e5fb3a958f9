"""`fm simulate` from the shell: JSON a script can read, plots a person can look at, and
one red line for a bad knob."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from fm_pipeline.cli.main import app

runner = CliRunner()


def test_fm_simulate_job_prints_json_and_writes_plots(tmp_path):
    out = runner.invoke(app, ["simulate", "job", "--gpus", "2048", "--days", "10", "--seeds", "2",
                              "--json", "--plot", str(tmp_path)])
    assert out.exit_code == 0, out.output
    data = json.loads(out.stdout)
    assert data["config"]["n_gpus"] == 2048 and len(data["runs"]) == 2
    assert [r["seed"] for r in data["runs"]] == [0, 1]
    assert all(0.5 < r["ettr"] < 1 and r["interruptions"] > 0 for r in data["runs"])
    for name in ("sim-timeline.png", "sim-lost-by-cause.png"):
        png = (tmp_path / name).read_bytes()
        assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000


def test_fm_simulate_job_tables_name_the_causes():
    out = runner.invoke(app, ["simulate", "job", "--days", "3", "--stragglers-per-node-day",
                              "0.01", "--straggler-mitigation", "exclude"])
    assert out.exit_code == 0, out.output
    for text in ("ETTR", "lost GPU-hours by cause", "lost_work", "stragglers: seen / detected / excluded"):
        assert text in out.stdout


def test_fm_simulate_job_with_the_fast_tier_restarts_in_the_job_and_gains_ettr():
    args = ["simulate", "job", "--days", "10", "--seeds", "2", "--json"]
    durable = json.loads(runner.invoke(app, args).stdout)["runs"]
    out = runner.invoke(app, [*args, "--fast-tier"])
    assert out.exit_code == 0, out.output
    data = json.loads(out.stdout)
    assert data["config"]["fast_tier"] == {"interval_s": 30.0, "restart_s": 60.0,
                                           "load_s": 1.0, "survivable": None}
    fast = data["runs"]
    # The same failures (their own random stream), most of them now served from memory:
    # all but software bugs, dependencies, silent data corruption and planned maintenance.
    assert [r["interruptions"] for r in fast] == [r["interruptions"] for r in durable]
    for f, d in zip(fast, durable):
        assert f["ettr"] > d["ettr"] + 0.02
        assert 0.5 * f["restarts"] < f["in_job_restarts"] < f["restarts"]
    table = runner.invoke(app, ["simulate", "job", "--days", "3", "--fast-tier"])
    assert table.exit_code == 0, table.output
    for text in ("fast tier: a snapshot every 30 s", "restarts: in-job from memory / durable"):
        assert text in table.stdout


def test_fm_simulate_sweep_interval_finds_the_optimum_near_daly():
    out = runner.invoke(app, ["simulate", "sweep-interval", "--days", "15", "--points", "5",
                              "--spread", "6", "--seeds", "1", "--json"])
    assert out.exit_code == 0, out.output
    data = json.loads(out.stdout)
    assert len(data["points"]) == 5
    assert data["daly_interval_s"] / 3 < data["optimum_s"] < data["daly_interval_s"] * 3


def test_fm_simulate_tenants_replays_a_synthetic_trace():
    out = runner.invoke(app, ["simulate", "tenants", "--jobs", "40", "--pool-gpus", "512", "--json"])
    assert out.exit_code == 0, out.output
    data = json.loads(out.stdout)
    assert data["completed"] == 40 and set(data["tenants"]) == {"research", "prod", "eval"}


def _error(args) -> str:
    out = runner.invoke(app, args)
    assert out.exit_code == 2, out.output
    assert "Traceback" not in out.output
    return " ".join(out.output.split())  # rich wraps long lines


def test_bad_knobs_fail_with_one_line_naming_them(tmp_path):
    assert "interval_s must be > 0" in _error(["simulate", "job", "--interval-min", "-5"])
    assert "mitigation must be none, report or exclude" in _error(
        ["simulate", "job", "--straggler-mitigation", "pray"])
    assert "does not exist" in _error(["simulate", "tenants", "--trace", str(tmp_path / "no.jsonl")])
    assert "--fast-survivable needs --fast-tier" in _error(
        ["simulate", "job", "--fast-survivable", "0.5"])
    assert "survivable must be within [0, 1]" in _error(
        ["simulate", "job", "--fast-tier", "--fast-survivable", "1.5"])
