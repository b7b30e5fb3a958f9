"""`fm chaos`: inject faults into real local runs, and the straggler policy's record.

    fm chaos list                                   # the faults of the matrix
    fm chaos run                                    # all of them -> <workspace>/fault-matrix.md
    fm chaos run --out docs/fault-matrix.md         # regenerate the tracked table
    fm chaos run --faults kill-rank,preempt --out /tmp/matrix.md
    fm chaos stragglers --job configs/demo.yaml     # events, idle GPU-hours, exclusions
    fm chaos stragglers --job configs/demo.yaml --scan   # re-run the detector offline
    fm chaos clear-exclusions --job configs/demo.yaml    # use excluded slots/hosts again

`run` trains the debug model on the small data mix in a fresh FM_HOME of its own
(.fm/chaos/<time>/ by default, kept for inspection) and takes ~10 minutes on 2 cores.
Faults that need root (disk-full mounts a tmpfs, kill-node uses network namespaces when it
can) say why they were skipped, or fall back to loopback.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import datetime, timezone
from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from fm_pipeline.cli.errors import user_errors
from fm_pipeline.cli.options import JOB
from fm_pipeline.config import load_job
from fm_pipeline.config.site import Site

app = typer.Typer(no_args_is_help=True, pretty_exceptions_enable=False)
console = Console()

VERDICT_STYLE = {"pass": "green", "FAIL": "bold red", "error": "bold red", "skipped": "yellow"}


@app.command("list")
def list_faults() -> None:
    """The faults `fm chaos run` injects, in table order."""
    from fm_pipeline.resilience.matrix import FAULTS, describe

    table = Table("fault", "what is injected")
    for fault in FAULTS:
        table.add_row(fault, describe(fault))
    console.print(table)


def _parse_faults(text: str | None) -> list[str]:
    from fm_pipeline.resilience.matrix import FAULTS

    if not text:
        return list(FAULTS)
    faults = [f.strip() for f in text.split(",") if f.strip()]
    unknown = [f for f in faults if f not in FAULTS]
    if unknown:
        raise ValueError(f"unknown fault(s) {', '.join(unknown)}; known: {', '.join(FAULTS)}")
    return faults


@app.command("run")
@user_errors
def run(
    faults: str = typer.Option(None, "--faults", "-f", help="comma-separated (default: all)"),
    home: Path = typer.Option(None, "--home", help="FM_HOME for the runs (default: "
                                                   ".fm/chaos/<utc time>)"),
    out: Path = typer.Option(None, "--out",
                             help="the markdown table to write (default: fault-matrix.md in "
                                  "the workspace; the tracked one is docs/fault-matrix.md, "
                                  "written only when asked)"),
    json_out: Path = typer.Option(None, "--json", help="also write the results as JSON"),
) -> None:
    """Inject each fault into a real local run, check the outcome, write the table."""
    from fm_pipeline.resilience.matrix import describe, render_table, run_fault, write_fault_matrix
    from fm_pipeline.resilience.workspace import ChaosWorkspace

    selected = _parse_faults(faults)
    # Discovery warns about every checkpoint a fault damaged; the table reports them.
    logging.getLogger("fm_pipeline.checkpoint").setLevel(logging.ERROR)
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S")
    ws = ChaosWorkspace(home or Path(".fm") / "chaos" / stamp)
    out = out or ws.home / "fault-matrix.md"
    console.print(f"chaos workspace: {ws.home}")
    results = []
    with console.status("") as status:
        for i, fault in enumerate(selected, 1):
            status.update(f"[{i}/{len(selected)}] {fault}: {describe(fault)}")
            result = run_fault(ws, fault)
            results.append(result)
            style = VERDICT_STYLE[result.verdict]
            note = result.skipped or result.error or "; ".join(result.failed_checks())
            console.print(f"[{style}]{result.verdict:>7}[/] {fault} ({result.wall_s:.0f} s)"
                          + (f": {escape(note)}" if note else ""), highlight=False)
    command = "fm chaos run" + (f" --faults {faults}" if faults else "") + \
        (f" --out {out}" if out != ws.home / "fault-matrix.md" else "")
    write_fault_matrix(results, out, command=command)
    if json_out:
        json_out.write_text(json.dumps([r.to_dict() for r in results], indent=2))
    console.print(f"wrote {out}")
    if not sys.stdout.isatty():
        console.print(render_table(results), highlight=False, markup=False)
    if any(r.verdict in ("FAIL", "error") for r in results):
        raise typer.Exit(1)


@app.command("stragglers")
@user_errors
def stragglers(job_path: Path = JOB,
               scan: bool = typer.Option(False, "--scan", help="also run the detector over "
                                                               "rank_timings.jsonl")) -> None:
    """Straggler events of a job, what they cost, and the slots/hosts excluded."""
    from fm_pipeline.stragglers.history import scan_rank_timings, straggler_summary

    job = load_job(job_path)
    runs = Site.from_environ().runs_dir(job.name)
    summary = straggler_summary(job, runs)
    table = Table("segment", "rank", "host", "section", "severity", "steps", "action",
                  "idle GPU-h", title=f"stragglers of {job.name}")
    for e in summary["events"]:
        table.add_row(str(e.get("segment")), str(e.get("rank")), str(e.get("host")),
                      str(e.get("section")), f"+{100 * float(e.get('severity') or 0):.0f}%",
                      f"{e.get('first_step')}-{e.get('last_step')}", str(e.get("action")),
                      f"{float(e.get('idle_gpu_hours') or 0):.4f}")
    console.print(table)
    console.print(f"idle GPU-hours {summary['idle_gpu_hours']:.4f} "
                  f"(${summary['idle_dollars']:.2f} at ${job.cluster.price_per_gpu_hour}/GPU-h); "
                  f"excluded: {summary['excluded'] or 'nothing'}")
    if scan:
        for segment, events in scan_rank_timings(runs).items():
            found = ", ".join(f"rank {e.rank} {e.section} +{100 * e.severity:.0f}% from step "
                              f"{e.first_step}" for e in events) or "no straggler"
            console.print(f"scan {segment}: {found}")


@app.command("clear-exclusions")
@user_errors
def clear_exclusions(job_path: Path = JOB) -> None:
    """Let the job use the rank slots and hosts its straggler policy excluded again."""
    from fm_pipeline.rundir.events import append_event
    from fm_pipeline.stragglers.mitigation import excluded_slots

    job = load_job(job_path)
    runs = Site.from_environ().runs_dir(job.name)
    before = excluded_slots(runs)
    append_event(runs, "exclusions_cleared",
                 slots=[f"{s.host}/local rank {s.local_rank}" for s in before])
    console.print(f"cleared {len(before)} exclusion(s) of {job.name}")
