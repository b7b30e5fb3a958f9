"""`fm ckpt`: list, validate, drill, export, retain and upload checkpoints.

    fm ckpt list --job configs/demo.yaml                 # both tiers, with marks and status
    fm ckpt validate --job configs/demo.yaml             # newest valid, and why newer ones fail
    fm ckpt validate 20 --job configs/demo.yaml          # one checkpoint (step, dir or store key)
    fm ckpt drill --job configs/demo.yaml [--nproc 1]    # restore on another topology, verify
    fm ckpt export 20 model.pt --job configs/demo.yaml   # one torch.save file (dcp_to_torch_save)
    fm ckpt retain --job configs/demo.yaml [--dry-run]   # apply keep_last / milestone_every
    fm ckpt upload --job configs/demo.yaml               # retry uploads that did not commit
"""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from fm_pipeline.cli.errors import user_errors
from fm_pipeline.cli.options import JOB
from fm_pipeline.config import load_job
from fm_pipeline.config.site import Site

app = typer.Typer(no_args_is_help=True, pretty_exceptions_enable=False)
console = Console()

STORE = typer.Option(None, "--store", help="object store URI (default: FM_STORE_URI or <FM_HOME>/store)")
CHECKPOINT = typer.Argument(None, help="step number, step-XXXXXXXX, a directory, or a store key "
                                       "prefix; default: the newest valid checkpoint")


def _site(uri: str | None) -> Site:
    """This command's Site (the entry point reads FM_HOME, FM_STORE_URI), `--store` winning."""
    return Site.from_environ().with_store(uri)


def _resolve(checkpoint: str | None, job, store, site: Site):
    """A CheckpointRef from what the user typed."""
    from fm_pipeline.catalog import CheckpointRef, latest_valid, store_root
    from fm_pipeline.catalog.refs import step_dir_name

    local_root = site.checkpoints_dir(job.name)
    if checkpoint in (None, "latest"):
        found = latest_valid(job, store=store, checksums=False, root=local_root)
        if found.found is None:
            raise ValueError(f"job {job.name!r} has no valid checkpoint in "
                             f"{local_root} or {store.uri_of(store_root(job.name))}")
        return found.found
    if Path(checkpoint).is_dir():
        return CheckpointRef.local(checkpoint)
    name = step_dir_name(int(checkpoint)) if checkpoint.isdigit() else checkpoint
    if (local_root / name).is_dir():
        return CheckpointRef.local(local_root / name)
    prefix = name if "/" in name else f"{store_root(job.name)}/{name}"
    if prefix.startswith(store.uri.rstrip("/") + "/"):
        prefix = prefix[len(store.uri.rstrip("/")) + 1:]
    ref = CheckpointRef.remote(store, prefix)
    if not ref.files():
        raise ValueError(f"no checkpoint {checkpoint!r}: not in {local_root} nor at "
                         f"{ref.location}")
    return ref


@app.command("list")
@user_errors
def list_(job: Path = JOB, store: str | None = STORE,
          verify: bool = typer.Option(True, "--verify/--no-verify",
                                      help="re-hash local files whose verified mark is stale "
                                           "(default); --no-verify checks structure only")) -> None:
    """Every checkpoint of the job in both tiers, validated: status, size, tokens, topology,
    marks; then the checkpoints set aside (superseded, invalid, replaced) with the reason."""
    from fm_pipeline.catalog import read_marks, validate
    from fm_pipeline.catalog.set_aside import list_set_aside
    from fm_pipeline.catalog.validate import candidates
    from fm_pipeline.catalog.validity import check

    spec, site = load_job(job), _site(store)
    target, root = site.store(), site.checkpoints_dir(spec.name)
    table = Table(title=f"checkpoints of {spec.name}")
    for col in ("step", "tier", "status", "MB", "tokens", "written at", "marks"):
        table.add_column(col)
    refs = sorted(candidates(spec.name, store=target, root=root), key=lambda r: (r.step, not r.is_local))
    with console.status("validating checkpoints"):
        rows = [(ref, check(ref, spec) if verify else validate(ref, spec, checksums=False))
                for ref in refs]
        aside = list_set_aside(spec.name, store=target, root=root)
    shown = []  # (step, order, cells): one step's copies together, set-aside ones last
    for ref, problems in rows:
        status = "[green]valid[/]" if not problems else f"[red]{problems[0]}[/]"
        if problems and problems[0].kind == "superseded":
            status = f"[yellow]{problems[0]}[/]"
        facts = ("", "", "")
        if not any(p.where.startswith("manifest.json") for p in problems):
            facts = _facts(ref)
        shown.append((ref.step, 0, [str(ref.step), "local" if ref.is_local else "store",
                                    status, *facts, _marks(read_marks(ref))]))
    for entry in aside:
        tier = "local" if entry.ref.is_local else "store"
        colour = "yellow" if entry.kind == "superseded" else "red"
        shown.append((entry.ref.step, 1, [
            str(entry.ref.step), f"{tier} (set aside)",
            f"[{colour}]{entry.kind}: {entry.reason}[/] ({entry.at})",
            *_facts_or_blank(entry.ref), ""]))
    for _, _, cells in sorted(shown, key=lambda row: row[:2]):
        table.add_row(*cells)
    console.print(table)


def _marks(marks: dict) -> str:
    shown = [f"drill {'passed' if v.get('passed') else 'FAILED'}" if k == "drill"
             else f"upload {'ok' if v.get('committed') else 'PENDING'}" if k == "upload"
             else k for k, v in sorted(marks.items()) if k not in ("verified", "set_aside")]
    return ", ".join(shown)


def _facts_or_blank(ref) -> tuple[str, str, str]:
    try:
        return _facts(ref)
    except (FileNotFoundError, ValueError):
        return ("", "", "")


def _facts(ref) -> tuple[str, str, str]:
    """MB, tokens and topology from a readable manifest."""
    from fm_pipeline.catalog import read_manifest
    from fm_pipeline.checkpoint.drill import describe_topology

    m = read_manifest(ref)
    return (f"{m.total_bytes / 1e6:.1f}", f"{m.tokens_seen:,}",
            describe_topology(m.parallelism.model_dump()))


@app.command("validate")
@user_errors
def validate_(checkpoint: str | None = CHECKPOINT, job: Path = JOB,
              store: str | None = STORE) -> None:
    """Check one checkpoint (or find the newest valid one); exit 1 if invalid."""
    from fm_pipeline.catalog import latest_valid, validate

    spec, site = load_job(job), _site(store)
    target = site.store()
    if checkpoint is None:
        with console.status("validating checkpoints, newest first"):
            found = latest_valid(spec, store=target, root=site.checkpoints_dir(spec.name))
        for line in found.skipped_lines():
            console.print(f"[yellow]skipped[/] {line}", highlight=False)
        if found.found is None:
            console.print(f"[red]no valid checkpoint[/] for job {spec.name}")
            raise typer.Exit(1)
        console.print(f"[green]valid[/]: {found.found.location} (step {found.found.step})")
        return
    ref = _resolve(checkpoint, spec, target, site)
    with console.status(f"validating {ref.location}"):
        problems = validate(ref, spec)
    for p in problems:
        console.print(f"[red]problem[/] {p}", highlight=False)
    if problems:
        raise typer.Exit(1)
    console.print(f"[green]valid[/]: {ref.location}")


@app.command("drill")
@user_errors
def drill(checkpoint: str | None = CHECKPOINT, job: Path = JOB, store: str | None = STORE,
          nproc: int | None = typer.Option(None, "--nproc", help="drill world size (pure FSDP); "
                                                              "default: chosen from the source")) -> None:
    """Restore on a different topology and verify params, optimizer, probe loss and cursor."""
    from fm_pipeline.checkpoint.drill import run_restore_drill

    spec, site = load_job(job), _site(store)
    ref = _resolve(checkpoint, spec, site.store(), site)
    parallelism = {"nproc_per_node": nproc} if nproc else None
    with console.status(f"restore drill of {ref.location}"):
        result = run_restore_drill(ref, site=site, job=spec, parallelism=parallelism)
    console.print(result.summary(), highlight=False)
    if not result.passed:
        raise typer.Exit(1)


@app.command("export")
@user_errors
def export(checkpoint: str = typer.Argument(..., help="step, directory or store key prefix"),
           out: Path = typer.Argument(..., help="output .pt file"), job: Path = JOB,
           store: str | None = STORE) -> None:
    """Write the checkpoint as one torch.save file with torch's dcp_to_torch_save."""
    from fm_pipeline.checkpoint import export_torch_save

    spec, site = load_job(job), _site(store)
    ref = _resolve(checkpoint, spec, site.store(), site)
    with console.status(f"exporting {ref.location}"):
        path = export_torch_save(ref, out, cache_root=site.checkpoints_dir(spec.name))
    console.print(f"[green]wrote[/] {path} ({path.stat().st_size / 1e6:.1f} MB)")


@app.command("retain")
@user_errors
def retain(job: Path = JOB, store: str | None = STORE,
           tier: str = typer.Option("both", "--tier", help="local, store or both"),
           dry_run: bool = typer.Option(False, "--dry-run", help="report, delete nothing")) -> None:
    """Apply the job's retention (keep_last, milestone_every, marks, newest valid)."""
    from fm_pipeline.catalog import apply_retention

    spec, site = load_job(job), _site(store)
    target = site.store()
    if tier not in ("local", "store", "both"):
        raise ValueError(f"--tier must be local, store or both, got {tier!r}")
    ck = spec.checkpoint
    for t in ("local", "store") if tier == "both" else (tier,):
        report = apply_retention(spec.name, keep_last=ck.keep_last,
                                 milestone_every=ck.milestone_every, tier=t, store=target,
                                 job=spec, dry_run=dry_run,
                                 root=site.checkpoints_dir(spec.name))
        console.print(report.summary(), highlight=False)
        for err in report.errors:
            console.print(f"[red]error[/] {err}", highlight=False)


@app.command("upload")
@user_errors
def upload(job: Path = JOB, store: str | None = STORE) -> None:
    """Upload every committed local checkpoint the store does not have yet; exit 1 on failure."""
    from fm_pipeline.catalog import sync_to_store

    spec, site = load_job(job), _site(store)
    target = site.store()
    with console.status(f"uploading pending checkpoints to {target.uri}"):
        reports = sync_to_store(spec.name, target, root=site.checkpoints_dir(spec.name))
    for r in reports:
        verdict = "[green]committed[/]" if r.committed else f"[red]failed[/]: {r.error}"
        console.print(f"step {r.step}: {verdict} ({r.bytes / 1e6:.1f} MB, "
                      f"{r.bytes_per_s / 1e6:.1f} MB/s)", highlight=False)
    if not reports:
        console.print("nothing to upload")
    if any(not r.committed for r in reports):
        raise typer.Exit(1)
