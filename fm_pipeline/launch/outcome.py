"""What happened to a segment: the worker's real exit code and reason, not torchrun's "1".

Evidence, strongest first:
  1. torchrun's own error file (TORCHELASTIC_ERROR_FILE of the agent): the root-cause
     worker's record, with `errorCode` set by torchrun to that worker's real exit code;
  2. torchrun's failure summary in its output ("rank : 1 ... exitcode : 75"), which also
     covers workers that died by a signal and left no record;
  3. the per-worker error files under `--log-dir` (written by torch's `@record` for
     exceptions, by exit_record.exit_with for deliberate exits).
The first source that names an exit code decides it; the reason comes from the first
that has one. torchrun's "first observed failure" is decided by whole seconds: when it is a
worker that only lost its peer ("Connection closed by peer"), another worker's own failure
on record (an error file, or a signal in torchrun's list of failures) is the cause instead.
On Kubernetes the same parsers read the pod's termination message.
"""

from __future__ import annotations

import json
import re
import signal
from dataclasses import asdict, dataclass, field, replace
from enum import Enum
from pathlib import Path

from fm_pipeline.rundir import exit_codes
from fm_pipeline.rundir.attempts import is_peer_loss


class Outcome(str, Enum):
    SUCCEEDED = "succeeded"
    PREEMPTED = "preempted"  # checkpointed and exited on purpose: resume, do not count it
    BAD_CONFIG = "bad_config"  # retrying cannot help
    FAILED = "failed"
    KILLED = "killed"  # a worker died by a signal (OOM killer, kill -9, node loss)
    TIMED_OUT = "timed_out"  # the launcher stopped it after its time limit
    LEASE_HELD = "lease_held"  # another live segment of the job holds it: this one did nothing


def outcome_of(exit_code: int) -> Outcome:
    if exit_code == exit_codes.SUCCESS:
        return Outcome.SUCCEEDED
    if exit_code == exit_codes.PREEMPTED:
        return Outcome.PREEMPTED
    if exit_code == exit_codes.BAD_CONFIG:
        return Outcome.BAD_CONFIG
    if exit_code == exit_codes.LEASE_HELD:
        return Outcome.LEASE_HELD
    if exit_code < 0 or exit_code > 128:
        return Outcome.KILLED
    return Outcome.FAILED


@dataclass(frozen=True)
class FailureEvidence:
    """One source's account of the root-cause worker; unknown fields are None."""

    source: str
    exit_code: int | None = None
    reason: str | None = None
    rank: int | None = None
    traceback: str | None = None
    time_ns: int | None = None

    def merged(self, other: FailureEvidence) -> FailureEvidence:
        """Fill what this source lacks from another about the same rank."""
        if other.rank is not None and self.rank is not None and other.rank != self.rank:
            return self
        return replace(
            self,
            exit_code=self.exit_code if self.exit_code is not None else other.exit_code,
            reason=self.reason or other.reason,
            rank=self.rank if self.rank is not None else other.rank,
            traceback=self.traceback or other.traceback,
        )


@dataclass(frozen=True)
class SegmentResult:
    """A finished segment. `exit_code` is the root-cause worker's own code (0 on success)."""

    job: str
    end_step: int
    outcome: Outcome
    exit_code: int
    reason: str
    torchrun_exit_code: int
    duration_s: float
    failed_rank: int | None = None
    traceback: str | None = None
    evidence: str | None = None  # where the exit code and reason were read
    segment_dir: str | None = None
    output_log: str | None = None
    error_files: tuple[str, ...] = field(default=())

    @property
    def ok(self) -> bool:
        return self.outcome is Outcome.SUCCEEDED

    def to_dict(self) -> dict:
        data = asdict(self)
        data["outcome"] = self.outcome.value
        data["error_files"] = list(self.error_files)
        return data

    @classmethod
    def from_dict(cls, data: dict) -> SegmentResult:
        data = dict(data)
        data["outcome"] = Outcome(data["outcome"])
        data["error_files"] = tuple(data.get("error_files") or ())
        return cls(**data)

    def raise_for_outcome(self) -> SegmentResult:
        if self.outcome is Outcome.SUCCEEDED:
            return self
        if self.outcome is Outcome.PREEMPTED:
            raise SegmentPreempted(self)
        raise SegmentFailed(self)


class SegmentFailed(RuntimeError):
    """A segment that did not reach its end step; `result` says why."""

    def __init__(self, result: SegmentResult):
        self.result = result
        where = f" (rank {result.failed_rank})" if result.failed_rank is not None else ""
        super().__init__(
            f"segment {result.job} -> step {result.end_step} {result.outcome.value}: "
            f"exit code {result.exit_code}{where}: {result.reason}"
        )


class SegmentPreempted(SegmentFailed):
    """Preempted: the trainer checkpointed and exited on purpose; resume it."""


# ---------------------------------------------------------------------------------------
# Parsers

_RECORD_CODE = re.compile(r'"errorCode":\s*(-?\d+)')
_RECORD_MESSAGE = re.compile(r'"message":\s*"((?:[^"\\]|\\.)*)"')


def parse_error_record(text: str, *, source: str) -> FailureEvidence | None:
    """A torch-elastic error file (possibly cut short, as in a termination message)."""
    text = text.strip()
    if not text.startswith("{"):
        return None
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        # Truncated: errorCode and message come first in our records.
        code = _RECORD_CODE.search(text)
        messages = _RECORD_MESSAGE.findall(text)
        if not code and not messages:
            return None
        reason = json.loads(f'"{messages[0]}"') if messages else None
        return FailureEvidence(source, exit_code=int(code.group(1)) if code else None,
                               reason=reason)
    message = data.get("message")
    if isinstance(message, str):
        return FailureEvidence(source, reason=message)
    if not isinstance(message, dict):
        return None
    extra = message.get("extraInfo") or {}
    rank = extra.get("rank")
    time_ns = extra.get("time_ns")
    if time_ns is None and str(extra.get("timestamp", "")).isdigit():
        time_ns = int(extra["timestamp"]) * 1_000_000_000
    return FailureEvidence(
        source,
        exit_code=message.get("errorCode"),
        reason=message.get("message"),
        rank=int(rank) if rank is not None else None,
        traceback=extra.get("py_callstack"),
        time_ns=time_ns,
    )


_ROOT_CAUSE = re.compile(r"Root Cause \(first observed failure\):\n(.*?)\n=+", re.S)
_SUMMARY_RANK = re.compile(r"^\s*rank\s*:\s*(\d+) \(local_rank: \d+\)", re.M)
_SUMMARY_CODE = re.compile(r"^\s*exitcode\s*:\s*(-?\d+) \(pid: \d+\)(?: \((\w+)\))?", re.M)
_SUMMARY_TRACE = re.compile(r"^\s*traceback\s*:\s*(.*)", re.M | re.S)
_NO_TRACEBACK = "To enable traceback see"


def parse_torchrun_summary(text: str, *, source: str) -> FailureEvidence | None:
    """The "Root Cause (first observed failure)" block torchrun prints when a worker fails."""
    blocks = _ROOT_CAUSE.findall(text)
    if blocks:
        block = blocks[-1]  # with --max-restarts, the last attempt decides
    else:
        # A log tail (a termination message) may have lost the header: the root cause is
        # printed last, so its fields are the last of their kind.
        starts = [m.start() for m in _SUMMARY_RANK.finditer(text)]
        if not starts or not _SUMMARY_CODE.search(text, starts[-1]):
            return None
        block = text[starts[-1]:].split("\n====")[0]
    rank = _SUMMARY_RANK.search(block)
    code = _SUMMARY_CODE.search(block)
    trace = _SUMMARY_TRACE.search(block)
    traceback = trace.group(1).strip() if trace else None
    reason = None
    if traceback and _NO_TRACEBACK not in traceback:
        reason = traceback.strip().splitlines()[-1].strip()
    elif code and code.group(2):
        reason = f"worker killed by {code.group(2)}"
    return FailureEvidence(
        source,
        exit_code=int(code.group(1)) if code else None,
        reason=reason,
        rank=int(rank.group(1)) if rank else None,
        traceback=traceback if reason and _NO_TRACEBACK not in (traceback or "") else None,
    )


_OTHER_FAILURES = re.compile(r"^Failures:\n(.*?)^-+\nRoot Cause", re.S | re.M)


# torchrun ends the surviving workers with SIGTERM once one has failed (the trainer's own
# SIGTERM handler turns a real stop into exit 75): a worker that died by it after raising
# its own error was torn down, and the whole-second ordering can still name it first.
_TEARDOWN_CODES = (-signal.SIGTERM, 128 + signal.SIGTERM)


def _is_consequence(evidence: FailureEvidence) -> bool:
    return is_peer_loss(evidence.reason) or evidence.exit_code in _TEARDOWN_CODES


def parse_other_failures(text: str, *, source: str) -> list[FailureEvidence]:
    """The workers torchrun lists under "Failures:" besides its root cause (a SIGKILLed
    worker leaves no error file, only this)."""
    found = []
    for blocks in _OTHER_FAILURES.findall(text)[-1:]:
        for block in re.split(r"^\[\d+\]:\n", blocks, flags=re.M)[1:]:
            entry = parse_torchrun_summary(f"Root Cause (first observed failure):\n{block}\n==",
                                           source=source)
            if entry is not None and entry.exit_code is not None:
                found.append(entry)
    return found


def worker_error_files(log_dir: Path) -> list[Path]:
    """Per-worker error files of torchrun's latest attempt: <run>/attempt_<k>/<rank>/error.json."""
    attempts = sorted(
        log_dir.glob("*/attempt_*"),
        key=lambda p: (p.stat().st_mtime, int(p.name.removeprefix("attempt_") or 0)),
    )
    if not attempts:
        return []
    return sorted(p for p in attempts[-1].glob("*/error.json") if p.is_file())


def _read_records(paths: list[Path]) -> list[FailureEvidence]:
    found = []
    for path in paths:
        try:
            evidence = parse_error_record(path.read_text(encoding="utf-8", errors="replace"),
                                          source=str(path))
        except OSError:
            continue
        if evidence:
            found.append(evidence)
    return found


def diagnose(*, log_dir: Path | None, agent_error_file: Path | None,
             output_text: str | None) -> FailureEvidence:
    """Combine every source into one account of the root cause (see the module docstring)."""
    sources: list[FailureEvidence] = []
    if agent_error_file and agent_error_file.is_file():
        sources += _read_records([agent_error_file])
    if output_text:
        summary = parse_torchrun_summary(output_text, source="torchrun summary")
        if summary:
            sources.append(summary)
    workers = _read_records(worker_error_files(log_dir)) if log_dir and log_dir.is_dir() else []
    workers.sort(key=lambda e: (e.time_ns is None, e.time_ns or 0, e.rank or 0))
    sources += workers
    with_code = [s for s in sources if s.exit_code is not None]
    root = with_code[0] if with_code else (sources[0] if sources else None)
    if root is None:
        return FailureEvidence("none")
    for other in sources:
        if other is not root:
            root = root.merged(other)
    if root.exit_code == exit_codes.PREEMPTED:
        # A coordinated stop (the flag is all-reduced): every rank exits 75, and rank 0,
        # which decided or first saw it, records why (a straggler, a preemption notice).
        first = next((w for w in workers if w.rank == 0 and w.exit_code == root.exit_code
                      and w.reason), None)
        if first is not None:
            return first.merged(root)
    if _is_consequence(root):  # torchrun's "first" by the second: a consequence
        # torchrun's list first: it names every worker's rank and exit code.
        others = [*(parse_other_failures(output_text, source="torchrun summary")
                    if output_text else []), *workers]
        cause = next((e for e in others if e.rank != root.rank and e.reason
                      and not _is_consequence(e)), None)
        if cause is not None:
            return replace(cause.merged(root), exit_code=cause.exit_code if
                           cause.exit_code is not None else root.exit_code,
                           reason=cause.reason, rank=cause.rank)
    return root
