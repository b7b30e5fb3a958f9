"""`fm data prepare` prints the mix summary with its checks; user mistakes exit 2 with the
problem named, not a traceback."""

from __future__ import annotations

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
    for name, what in (("tokenizer.json", "tokenizer"), ("sample_index.bin", "sample index")):
        path = mix_dir / name
        original = path.read_bytes()
        tampered = bytearray(original)
        tampered[len(tampered) // 2] ^= 0x01  # same size, one bit
        path.write_bytes(bytes(tampered))
        bad = runner.invoke(app, ["verify", *args], env={"COLUMNS": "200"})
        assert bad.exit_code == 2, bad.output
        assert f"corrupted {what} data/{mix_dir.name}/{name}" in said(bad)
        path.write_bytes(original)
