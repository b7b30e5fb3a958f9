"""Turn the errors a user can cause into one red line and exit code 2, not a traceback."""

from __future__ import annotations

import functools

import typer
from rich.console import Console

from fm_pipeline.config import JobSpecError
from fm_pipeline.storage import StoreError

err_console = Console(stderr=True)

USER_ERRORS: tuple[type[Exception], ...] = (JobSpecError, StoreError, ValueError, FileNotFoundError)


def user_errors(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except USER_ERRORS as e:
            err_console.print(f"[bold red]error:[/] {e}", highlight=False)
            raise typer.Exit(2) from None

    return wrapper
