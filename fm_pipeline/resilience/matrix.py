"""The fault matrix: every fault injected into a real local run, its expected outcome checked,
and the table docs/fault-matrix.md is generated from.

    results = run_matrix(ChaosWorkspace(home), ["kill-rank", "preempt"], on_result=print)
    write_fault_matrix(results, Path("docs/fault-matrix.md"))

A scenario is a function (ChaosWorkspace) -> FaultResult that injects one fault, lets the
orchestration policy decide, resumes, and records checks (a sentence and whether it held).
Scenarios live in fm_pipeline.resilience.scenarios; FAULTS names them in table order.
"""

from __future__ import annotations

import importlib
import platform
import subprocess
import time
import traceback
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

from fm_pipeline.resilience.injectors import Unavailable


@dataclass
class FaultResult:
    fault: str
    injected: str = ""  # what was done, concretely
    expected: str = ""
    outcome: str = ""  # what happened
    checks: list[tuple[str, bool]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # known gaps, not counted as failures
    steps_lost: int | None = None
    detect_s: float | None = None  # fault -> the launcher saw the segment end
    resume_s: float | None = None  # fault -> first step of the resumed segment
    skipped: str | None = None
    error: str | None = None  # the scenario itself broke (not the system under test)
    wall_s: float = 0.0
    job: str | None = None  # whose records the figures were read from

    def record_figures(self, runs: Path) -> None:
        """Steps lost, detection and resume time, read from the job's records under `runs`
        (its metrics and events, fm_pipeline.resilience.figures): never set by hand."""
        from fm_pipeline.resilience.figures import figures_from_records

        figures = figures_from_records(runs)
        self.job = Path(runs).name
        self.steps_lost, self.detect_s, self.resume_s = (
            figures.steps_lost, figures.detect_s, figures.resume_s)

    def check(self, text: str, ok: bool) -> bool:
        self.checks.append((text, bool(ok)))
        return bool(ok)

    @property
    def passed(self) -> bool:
        return (self.skipped is None and self.error is None and bool(self.checks)
                and all(ok for _, ok in self.checks))

    @property
    def verdict(self) -> str:
        if self.skipped is not None:
            return "skipped"
        if self.error is not None:
            return "error"
        return "pass" if self.passed else "FAIL"

    def failed_checks(self) -> list[str]:
        return [text for text, ok in self.checks if not ok]

    def to_dict(self) -> dict:
        return {**asdict(self), "passed": self.passed, "verdict": self.verdict}


Scenario = Callable[..., FaultResult]


# fault -> (what it is, "module.function" in fm_pipeline.resilience.scenarios), table order
SCENARIOS: dict[str, tuple[str, str]] = {
    "kill-rank": ("SIGKILL one worker", "process.kill_rank"),
    "kill-node": ("lose a whole node of a 2-node run", "process.kill_node"),
    "hang-rank": ("one worker stops responding", "process.hang_rank"),
    "preempt": ("SIGTERM preemption", "process.preempt"),
    "ckpt-flip-byte": ("a byte flipped in the newest checkpoint", "checkpoint.flip_byte"),
    "ckpt-truncate": ("the newest checkpoint's shard truncated", "checkpoint.truncate"),
    "ckpt-delete": ("a file of the newest checkpoint deleted", "checkpoint.delete"),
    "s3-down": ("object store down during an upload", "storage.s3_down"),
    "disk-full": ("disk full during a save", "storage.disk_full"),
    "bad-config": ("an invalid job spec", "inputs.bad_config"),
    "bad-data": ("a corrupted data shard", "inputs.bad_data"),
    "ckpt-corrupt-both-tiers": ("the newest checkpoint corrupt in both tiers, trained past",
                                "writers.corrupt_both_tiers"),
    "second-trainer": ("a second trainer started on a live job", "writers.second_trainer"),
    "read-only-ckpt": ("the checkpoint directory on a read-only volume",
                       "writers.read_only_tier"),
    "api-kill-submit": ("`fm api serve` killed after submitting a run, before recording it",
                        "operations.api_kill_submit"),
    "daemon-kill": ("the dagster-daemon killed while a segment trains",
                    "operations.daemon_kill"),
    "clock-skew": ("a trainer elsewhere with its clock 120 s ahead starts on a live job",
                   "operations.clock_skew"),
}
FAULTS = tuple(SCENARIOS)


def describe(fault: str) -> str:
    return SCENARIOS[fault][0]


def scenario(fault: str) -> Scenario:
    if fault not in SCENARIOS:
        raise ValueError(f"unknown fault {fault!r}; known: {', '.join(FAULTS)}")
    module, function = SCENARIOS[fault][1].rsplit(".", 1)
    return getattr(importlib.import_module(f"fm_pipeline.resilience.scenarios.{module}"),
                   function)


def run_fault(ws, fault: str) -> FaultResult:
    """One scenario; a scenario that cannot run here is `skipped`, one that breaks is an
    `error` (with the traceback's last line), never an exception."""
    run = scenario(fault)
    t0 = time.monotonic()
    try:
        with ws.active():
            result = run(ws)
    except Unavailable as e:
        result = FaultResult(fault=fault, skipped=str(e))
    except Exception as e:
        result = FaultResult(fault=fault, error=f"{type(e).__name__}: {e}")
        result.outcome = traceback.format_exc(limit=3).strip().splitlines()[-1]
    result.wall_s = round(time.monotonic() - t0, 1)
    return result


def run_matrix(ws, faults: list[str] | tuple[str, ...] = FAULTS, *,
               on_result: Callable[[FaultResult], None] | None = None) -> list[FaultResult]:
    results = []
    for fault in faults:
        result = run_fault(ws, fault)
        results.append(result)
        if on_result is not None:
            on_result(result)
    return results


# --- the table ---------------------------------------------------------------------------

def _num(value: float | int | None, unit: str = "") -> str:
    if value is None:
        return "-"
    return f"{value:.1f}{unit}" if isinstance(value, float) else f"{value}{unit}"


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def render_table(results: list[FaultResult]) -> str:
    lines = ["| Fault | Injected | Expected | Outcome | Steps lost | Detected after "
             "| Time to resume | Verdict |",
             "|---|---|---|---|---|---|---|---|"]
    for r in results:
        outcome = r.outcome if r.skipped is None else f"skipped: {r.skipped}"
        lines.append("| " + " | ".join([
            f"`{r.fault}`", _cell(r.injected), _cell(r.expected), _cell(outcome),
            _num(r.steps_lost), _num(r.detect_s, " s"), _num(r.resume_s, " s"),
            r.verdict]) + " |")
    return "\n".join(lines)


def render_checks(results: list[FaultResult]) -> str:
    out = []
    for r in results:
        out.append(f"### `{r.fault}` ({r.verdict}, {r.wall_s:.0f} s)")
        if r.skipped:
            out.append(f"Skipped: {r.skipped}")
        if r.error:
            out.append(f"Scenario error: {r.error}")
        out += [f"- [{'x' if ok else ' '}] {_cell(text)}" for text, ok in r.checks]
        out += [f"- note: {_cell(text)}" for text in r.notes]
        out.append("")
    return "\n".join(out)


def _git_sha() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, timeout=5).stdout.strip() or "unknown"
    except OSError:
        return "unknown"


def write_fault_matrix(results: list[FaultResult], path: Path, *, command: str) -> Path:
    passed = sum(r.passed for r in results)
    skipped = sum(r.skipped is not None for r in results)
    header = f"""# Fault matrix

Generated by `{command}` on {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC
(commit {_git_sha()}, {platform.machine()}, {len(results)} faults: {passed} passed,
{skipped} skipped, {len(results) - passed - skipped} failed). Do not edit by hand: rerun
the command. What each fault does and why the expectations are what they are:
docs/resilience.md.

Every fault is injected into a real local run of the debug model on the small data mix
(2 ranks under torchrun, gloo on CPU; `kill-node`: 2 nodes x 1 rank running the Kubernetes
pod command; `api-kill-submit` and `daemon-kill`: jobs submitted through `fm api serve`,
run by its dagster-daemon). Every figure is read from the run's own records
(fm_pipeline/resilience/figures.py): rank 0's metrics.jsonl and the job's events.jsonl,
where the runner records the moment of each injection (`fault_injected`), an operator's
fix (`fault_cleared`) and each end of a segment it saw (`segment_ended`). *Steps lost*:
steps metrics.jsonl records more than once (trained before the fault, then again after
the resume). *Detected after*: from the injection to the launcher seeing the segment end;
"-" where no segment end marks it (damage at rest, found by the next restore, inside the
time to resume; a fault the run rides through). *Time to resume*: from the injection (or
the fix) to the first step of a segment launched after it (detection, process teardown,
start-up, restore), with the orchestrator's retry backoff set to zero; production adds
it. Timings come from a shared 2-core machine and are noisy.

"""
    body = render_table(results) + "\n\n## Checks\n\n" + render_checks(results)
    path.write_text(header + body, encoding="utf-8")
    return path
