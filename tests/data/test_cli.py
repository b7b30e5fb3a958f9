"""`fm data prepare` prints the mix summary with its checks; user mistakes exit 2 with the
problem named, not a traceback."""

from __future__ import annotations

import os

import yaml
from typer.testing import CliRunner

from fm_pipeline.cli.data import app
from fm_pipeline.data.testing import SMALL_JOB

runner = CliRunner()


def said(result) -> str:
    """Output with rich's line wrapping undone."""
    return " ".join(result.output.split())


def test_prepare_prints_summary_and_checks(tmp_path):
    job = tmp_path / "small.yaml"
    job.write_text(yaml.safe_dump(SMALL_JOB))
    plot = tmp_path / "cleaning.png"
    result = runner.invoke(app, ["prepare", "--job", str(job), "--store", str(tmp_path / "store"),
                                 "--plot", str(plot)], env={"COLUMNS": "160"})
    assert result.exit_code == 0, result.output
    out = result.output
    assert "code" in out and "prose" in out and "prose dropped: empty 1" in out
    assert "checks: 8/8 passed" in out
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and plot.stat().st_size > 5000
    again = runner.invoke(app, ["sample", "--job", str(job), "--store", str(tmp_path / "store"), "-n", "1"])
    assert again.exit_code == 0 and "sample 0" in again.output


def test_bad_job_and_missing_source_exit_2_naming_the_problem(tmp_path):
    bad = dict(SMALL_JOB, data={**SMALL_JOB["data"], "sources": [
        {"name": "a", "uri": str(tmp_path / "missing"), "weight": 1.0}]})
    job = tmp_path / "bad.yaml"
    job.write_text(yaml.safe_dump(bad))
    result = runner.invoke(app, ["prepare", "--job", str(job), "--store", str(tmp_path / "store")])
    assert result.exit_code == 2
    assert "error: source 'a': " in said(result) and "/missing does not exist" in said(result)

    bad["data"]["sources"] = [{"name": "a", "uri": "x", "weight": 0.3}, {"name": "b", "uri": "y", "weight": 0.3}]
    job.write_text(yaml.safe_dump(bad))
    result = runner.invoke(app, ["prepare", "--job", str(job)])
    assert result.exit_code == 2 and "data: source weights must sum to 1" in said(result)

    result = runner.invoke(app, ["show", "--job", str(tmp_path / "nope.yaml")])
    assert result.exit_code == 2 and "nope.yaml" in said(result) and "no such file" in said(result)


def test_verify_checks_every_artifact_the_manifest_lists(tmp_path):
    """The tokenizer and the sample index are checked like the shards: a tampered one is
    named and the command exits 2; the intact mix verifies."""
    job = tmp_path / "small.yaml"
    job.write_text(yaml.safe_dump(SMALL_JOB))
    args = ["--job", str(job), "--store", str(tmp_path / "store")]
    assert runner.invoke(app, ["prepare", *args]).exit_code == 0
    ok = runner.invoke(app, ["verify", *args], env={"COLUMNS": "160"})
    assert ok.exit_code == 0 and "tokenizer, sample index and" in said(ok)
    (mix_dir,) = (tmp_path / "store" / "data").iterdir()
    for name, what in (("tokenizer.json", "tokenizer"), ("sample_index/00000.bin", "sample index")):
        path = mix_dir / name
        original = path.read_bytes()
        tampered = bytearray(original)
        tampered[len(tampered) // 2] ^= 0x01  # same size, one bit
        path.write_bytes(bytes(tampered))
        bad = runner.invoke(app, ["verify", *args], env={"COLUMNS": "200"})
        assert bad.exit_code == 2, bad.output
        assert f"corrupted {what} data/{mix_dir.name}/{name}" in said(bad)
        path.write_bytes(original)


def test_prepare_with_workers_runs_data_mix_job_over_that_many_processes(tmp_path, capfd):
    """`--workers 2`: data_mix_job in the project's instance under the multiprocess executor
    (max_concurrent 2), its steps in processes of their own, which print no debug line each
    to the terminal; the mix it publishes is the one the in-process prepare publishes,
    shard for shard."""
    from dagster import DagsterEventType, DagsterInstance, RunsFilter

    from fm_pipeline.config import load_job
    from fm_pipeline.data import open_job_mix
    from fm_pipeline.storage import open_store

    job = tmp_path / "small.yaml"
    job.write_text(yaml.safe_dump(SMALL_JOB))
    result = runner.invoke(app, ["prepare", "--job", str(job), "--store", str(tmp_path / "dag"),
                                 "--workers", "2"], env={"COLUMNS": "160"})
    assert result.exit_code == 0, result.output
    assert "data_mix_job run " in said(result) and "checks: 8/8 passed" in said(result)
    # The step processes write to the terminal's file descriptors, past CliRunner.
    terminal = capfd.readouterr()
    assert " - DEBUG - " not in terminal.err + terminal.out, terminal.err[-2000:]
    instance = DagsterInstance.get()
    (record,) = instance.get_run_records(RunsFilter(job_name="data_mix_job"))
    config = record.dagster_run.run_config["execution"]["config"]["multiprocess"]
    assert config["max_concurrent"] == 2
    pids = {e.dagster_event.pid for e in instance.all_logs(record.dagster_run.run_id,
                                             of_type=DagsterEventType.STEP_START)}
    assert len(pids) > 2  # a process per step, none of them this one
    # Two encoders side by side: each takes half the cores instead of one pool per core each.
    threads = {e.dagster_event.step_output_data.metadata["encoder_threads"].value
               for e in instance.all_logs(record.dagster_run.run_id,
                                          of_type=DagsterEventType.STEP_OUTPUT)
               if e.dagster_event.step_key.startswith("token_shards.tokenize_part[")}
    assert threads == {max(1, len(os.sched_getaffinity(0)) // 2)}
    assert runner.invoke(app, ["prepare", "--job", str(job), "--store",
                               str(tmp_path / "inproc")]).exit_code == 0
    spec = load_job(job)
    dag, inproc = (open_job_mix(spec, open_store(tmp_path / d)).manifest for d in ("dag", "inproc"))
    assert [(s.name, [(e.tokens, e.sha256) for e in s.shards]) for s in dag.sources] == [
        (s.name, [(e.tokens, e.sha256) for e in s.shards]) for s in inproc.sources]
