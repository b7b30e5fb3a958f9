"""How the data pipeline reports progress: a sink the CLI draws as rich bars and the
Dagster layer turns into log lines. The default sink does nothing."""

from __future__ import annotations


class ProgressSink:
    def start(self, task: str, *, total: float | None = None, unit: str = "") -> None:
        """A task begins; `total` None means unknown length."""

    def advance(self, task: str, amount: float = 1) -> None:
        """`amount` more units of `task` are done."""

    def finish(self, task: str, summary: str = "") -> None:
        """`task` is complete; `summary` is one human line about it."""


NO_PROGRESS = ProgressSink()
