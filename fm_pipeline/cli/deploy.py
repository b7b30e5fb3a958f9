"""`fm deploy`: the Dagster instance fm runs on, and its processes on this machine.

    fm deploy instance                                  # DAGSTER_HOME/dagster.yaml (+ workspace)
    fm deploy instance --postgres postgresql://fm@127.0.0.1:5433/dagster
    fm deploy ui --port 3000                            # dagster-daemon + dagster-webserver

`ui` (= `make ui`) writes the instance, then runs the daemon (one per instance: an existing
one is used) and the webserver until interrupted, and stops both.
"""

from __future__ import annotations

import time

import typer
from rich.console import Console

from fm_pipeline.cli.errors import user_errors

app = typer.Typer(no_args_is_help=True, pretty_exceptions_enable=False)
console = Console()


def _write(postgres: str | None, max_concurrent_runs: int):
    from fm_pipeline.config.site import Site
    from fm_pipeline.deploy.instance import Postgres, Sqlite, write_instance

    storage = Postgres(postgres) if postgres else Sqlite()
    return write_instance(Site.from_environ().dagster_home, storage=storage,
                          max_concurrent_runs=max_concurrent_runs)


@app.command("instance")
@user_errors
def instance(postgres: str = typer.Option(None, "--postgres", help="postgresql://... storage"),
             max_concurrent_runs: int = typer.Option(4, "--max-concurrent-runs", min=1)) -> None:
    """Write DAGSTER_HOME/dagster.yaml and workspace.yaml (docs/orchestration.md)."""
    home = _write(postgres, max_concurrent_runs)
    console.print(f"wrote {home / 'dagster.yaml'} and {home / 'workspace.yaml'}")


@app.command("ui")
@user_errors
def ui(port: int = typer.Option(3000, "--port"), host: str = typer.Option("127.0.0.1", "--host"),
       postgres: str = typer.Option(None, "--postgres", help="postgresql://... storage")) -> None:
    """Run dagster-daemon and dagster-webserver for the instance until interrupted."""
    from fm_pipeline.deploy.services import (
        daemon,
        default_signal_dispositions,
        running,
        webserver,
    )

    default_signal_dispositions()
    home = _write(postgres, 4)
    with running(daemon(home), webserver(home, port=port, host=host)) as services:
        shared = " (already running, used)" if services[0].shared else ""
        console.print(f"Dagster UI on [bold]http://{host}:{port}[/]; daemon{shared}; instance "
                      f"{home}. Ctrl-C stops both.")
        try:
            while all(s.shared or s.process.poll() is None for s in services):
                time.sleep(1)
        except KeyboardInterrupt:
            pass
