"""`fm data`: prepare, inspect and verify the training data mix.

    fm data prepare --job configs/demo.yaml            # clean, tokenize, shard, publish, check
    fm data prepare --job JOB.yaml --store s3://bucket/prefix --endpoint-url http://127.0.0.1:9000
    fm data prepare --job JOB.yaml --workers 2         # as data_mix_job, tasks over 2 processes
    fm data show --job configs/demo.yaml               # the published mix's summary
    fm data verify --job configs/demo.yaml             # re-hash every shard against the manifest
    fm data sample --job configs/demo.yaml -n 2        # decode the first global samples
"""

from __future__ import annotations

from pathlib import Path

import typer
from rich import box
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table

from fm_pipeline.cli.errors import user_errors
from fm_pipeline.cli.options import JOB
from fm_pipeline.config import load_job
from fm_pipeline.config.site import Site
from fm_pipeline.data.progress import ProgressSink
from fm_pipeline.storage import ObjectStore

app = typer.Typer(no_args_is_help=True, pretty_exceptions_enable=False)
console = Console()

STORE = typer.Option(None, "--store", help="object store URI (default: FM_STORE_URI or <FM_HOME>/store)")
ENDPOINT = typer.Option(None, "--endpoint-url", help="S3 endpoint (default: FM_S3_ENDPOINT_URL)")


def _store(store: str | None, endpoint_url: str | None) -> ObjectStore:
    return Site.from_environ().with_store(store, s3_endpoint=endpoint_url).store()


def _open_mix(spec, store: str | None, endpoint_url: str | None):
    """The job's published mix; shards of a remote store cached under the site's home."""
    from fm_pipeline.data import mix_key, open_job_mix

    return open_job_mix(spec, _store(store, endpoint_url),
                        cache_dir=Site.from_environ().data_cache(mix_key(spec)))


@app.command("prepare")
@user_errors
def prepare(
    job: Path = JOB,
    store: str | None = STORE,
    endpoint_url: str | None = ENDPOINT,
    force: bool = typer.Option(False, "--force", help="rebuild even if the mix is published"),
    checks: bool = typer.Option(True, "--checks/--no-checks", help="run the data-quality checks"),
    plot: Path | None = typer.Option(None, "--plot",
                                     help="write a PNG of what cleaning kept and dropped"),
    workers: int | None = typer.Option(
        None, "--workers", min=1,
        help="run data_mix_job in the project's Dagster instance with this many processes "
             "(its tasks fanned out; default: every stage in this process)"),
) -> None:
    """Prepare the job's data mix (idempotent) and print its summary."""
    from fm_pipeline.data.pipeline import prepare_mix, unpublish
    from fm_pipeline.data.validate import validate_published

    spec = load_job(job)
    target = _store(store, endpoint_url)
    if workers and workers > 1:
        from fm_pipeline.cli.data_workers import run_data_mix_job
        from fm_pipeline.data import mix_key

        if force:
            unpublish(target, mix_key(spec))
        run_data_mix_job(spec, job, store_uri=target.uri, endpoint_url=endpoint_url,
                         workers=workers, console=console)
        force = False  # published by the run; prepare_mix below only opens it
    with RichProgress(console) as progress:
        manifest = prepare_mix(spec, target, force=force, progress=progress)
    outcomes = validate_published(target, manifest) if checks else None
    print_summary(manifest, target, outcomes)
    if plot is not None:
        from fm_pipeline.data.plots import plot_cleaning

        counts = {s.name: s.documents for s in manifest.sources}
        console.print(f"wrote {plot_cleaning(counts, plot)}", highlight=False)
    if outcomes and any(not o.passed and o.severity == "error" for o in outcomes):
        raise typer.Exit(1)


@app.command("show")
@user_errors
def show(job: Path = JOB, store: str | None = STORE, endpoint_url: str | None = ENDPOINT) -> None:
    """Summarise the job's published mix."""
    from fm_pipeline.data import open_job_mix

    target = _store(store, endpoint_url)
    print_summary(open_job_mix(load_job(job), target).manifest, target, None)


@app.command("verify")
@user_errors
def verify(job: Path = JOB, store: str | None = STORE, endpoint_url: str | None = ENDPOINT) -> None:
    """Re-hash every artifact the manifest lists (tokenizer, sample index, shards)."""
    mix = _open_mix(load_job(job), store, endpoint_url)
    with console.status(f"verifying mix {mix.key}"):
        nbytes = mix.verify()
    console.print(f"[green]ok[/]: mix {mix.key}: tokenizer, sample index and "
                  f"{sum(len(s.shards) for s in mix.manifest.sources)} shards "
                  f"({nbytes / 1e6:.1f} MB) match their SHA-256")


@app.command("sample")
@user_errors
def sample(
    job: Path = JOB, store: str | None = STORE, endpoint_url: str | None = ENDPOINT,
    n: int = typer.Option(2, "-n", help="how many global samples"),
    start: int = typer.Option(0, "--start", help="first global sample"),
) -> None:
    """Decode global samples `start .. start+n` back to text."""
    mix = _open_mix(load_job(job), store, endpoint_url)
    for i, (row, source) in enumerate(zip(mix.samples(start, n), mix.sample_sources(start, n))):
        console.rule(f"sample {start + i} ({source})")
        console.print(mix.decode(row), markup=False, highlight=False)


class RichProgress(ProgressSink):
    """Pipeline progress as rich bars (a spinner while a task's length is unknown)."""

    def __init__(self, console: Console):
        self._progress = Progress(
            SpinnerColumn(), TextColumn("{task.description:<18}"), BarColumn(),
            MofNCompleteColumn(), TextColumn("{task.fields[unit]}"), TimeElapsedColumn(),
            TextColumn("{task.fields[summary]}"), console=console, transient=False,
        )
        self._tasks: dict[str, int] = {}

    def __enter__(self) -> "RichProgress":
        self._progress.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._progress.__exit__(*exc)

    def start(self, task: str, *, total: float | None = None, unit: str = "") -> None:
        self._tasks[task] = self._progress.add_task(task, total=total, unit=unit, summary="")

    def advance(self, task: str, amount: float = 1) -> None:
        self._progress.advance(self._tasks[task], amount)

    def finish(self, task: str, summary: str = "") -> None:
        tid = self._tasks[task]
        done = self._progress.tasks[tid].completed if task in self._tasks else 0
        self._progress.update(tid, total=max(done, 1), completed=max(done, 1), summary=summary)


def print_summary(manifest, store: ObjectStore, outcomes, *, out: Console | None = None) -> None:
    """The mix at a glance: per-source documents and tokens, shards, samples, checks."""
    out = out or console
    table = Table(title=f"data mix {manifest.key}", title_justify="left", box=box.SIMPLE_HEAD,
                  padding=(0, 1), collapse_padding=True, pad_edge=False)
    for col in ("source", "weight", "docs", "kept", "dropped", "train tok", "heldout tok",
                "shards", "samples", "epochs"):
        table.add_column(col, justify="left" if col == "source" else "right")
    for s in manifest.sources:
        d = s.documents
        table.add_row(s.name, f"{s.weight:g}", f"{d.read:,}", f"{d.kept:,}", f"{d.dropped_total:,}",
                      _human(s.train_tokens), _human(s.heldout_tokens), str(len(s.shards)),
                      f"{s.samples:,}", f"{s.epochs:.3f}")
    out.print(table)
    for s in manifest.sources:
        if s.documents.dropped:
            why = ", ".join(f"{r} {n:,}" for r, n in s.documents.dropped.items())
            out.print(f"  {s.name} dropped: {why}", highlight=False)
    idx = manifest.sample_index
    out.print(
        f"store {store.uri_of('data/' + manifest.key)} | tokenizer vocab "
        f"{manifest.tokenizer.vocab_size} ({manifest.dtype}) | seq_len {manifest.seq_len} | "
        f"global sample index {idx.samples:,} samples | dedup ratio "
        f"{manifest.provenance.get('dedup_ratio', 0):.4f}",
        highlight=False,
    )
    if outcomes is None:
        return
    passed = sum(o.passed for o in outcomes)
    out.print(f"checks: {passed}/{len(outcomes)} passed", style="bold green" if passed == len(outcomes) else "bold red")
    for o in outcomes:
        mark = "[green]PASS[/]" if o.passed else ("[yellow]WARN[/]" if o.severity == "warn" else "[red]FAIL[/]")
        out.print(f"  {mark} {o.name}: {o.description}", highlight=False)


def _human(n: int) -> str:
    for unit, size in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= size:
            return f"{n / size:.3g}{unit}"
    return str(n)
