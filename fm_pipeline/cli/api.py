"""`fm api`: the training-jobs REST control plane, its tokens, and its Kueue objects.

    fm api token issue --tenant research        # prints a new token once (only its hash is kept)
    fm api serve                                # http://127.0.0.1:8600, embedded defaults
    fm api kueue render --tenants configs/tenants.yaml --out .fm/kueue
    fm api queue list                           # queued and running jobs; fm api queue drain --tenant T

`serve` uses the embedded tenants (configs/tenants.yaml), the FM_HOME object store and
queue database, and the Dagster orchestrator: it writes the instance's dagster.yaml
(DAGSTER_HOME; sqlite, or PostgreSQL with --postgres), submits each API run for the
daemon and reads run records; it starts no run itself. It keeps a dagster-daemon for the
instance (one per instance, whoever started it: a second `fm api serve` on the same
FM_HOME shares the first one's; --no-daemon where the deployment runs its own).
`--orchestrator local` runs torchrun segments in this process, without Dagster.
Logs never show tokens: every handler masks anything that looks like one.
"""

from __future__ import annotations

import contextlib
import copy
import os
from pathlib import Path

import typer
import yaml
from rich.console import Console

from fm_pipeline.cli.errors import user_errors
from fm_pipeline.config.site import Site

app = typer.Typer(no_args_is_help=True)
token_app = typer.Typer(no_args_is_help=True)
kueue_app = typer.Typer(no_args_is_help=True)
app.add_typer(token_app, name="token", help="Issue, list and revoke API tokens.")
app.add_typer(kueue_app, name="kueue", help="Kueue objects for the tenants config.")
queue_app = typer.Typer(no_args_is_help=True)
app.add_typer(queue_app, name="queue", help="The job queue: what it holds, draining a tenant.")
console = Console(stderr=True)
DEFAULT_PORT = 8600


@app.callback()
def api() -> None:
    """The training-jobs REST API: tenants, fair share, priorities, preemption."""


def _log_config() -> dict:
    import uvicorn.config

    config = copy.deepcopy(uvicorn.config.LOGGING_CONFIG)
    config["filters"] = {"redact": {"()": "fm_pipeline.api.auth.RedactSecrets"}}
    for handler in config["handlers"].values():
        handler["filters"] = ["redact"]
    config["loggers"]["fm_pipeline"] = {"handlers": ["default"], "level": "INFO",
                                        "propagate": False}
    return config


@app.command("serve")
@user_errors
def serve(
    host: str = typer.Option("127.0.0.1", "--host", help="address to listen on"),
    port: int = typer.Option(DEFAULT_PORT, "--port"),
    tenants: Path = typer.Option(None, "--tenants", help="tenants YAML (default: embedded)"),
    max_body_bytes: int = typer.Option(64 * 1024, "--max-body-bytes", min=1024),
    tick_s: float = typer.Option(2.0, "--tick-s", min=0.1, help="seconds between reconciles"),
    orchestrator: str = typer.Option(
        "dagster", "--orchestrator",
        help="dagster: runs on the Dagster instance (DAGSTER_HOME), started by its daemon; "
             "local: torchrun segments in threads of this process, records in runs.json"),
    postgres: str = typer.Option(None, "--postgres", help=(
        "instance storage in this PostgreSQL database (postgresql://user@host:port/db) "
        "instead of sqlite under DAGSTER_HOME")),
    keep_daemon: bool = typer.Option(True, "--daemon/--no-daemon", help=(
        "keep a dagster-daemon serving the instance while the API serves")),
) -> None:
    """Serve the API (OpenAPI at /openapi.json, docs at /docs)."""
    import uvicorn

    from fm_pipeline.deploy.services import default_signal_dispositions

    default_signal_dispositions()  # a background start must still stop on SIGTERM
    site = Site.from_environ()  # the entry point: where the queue, tokens and jobs live
    if orchestrator not in ORCHESTRATORS:
        raise ValueError(f"--orchestrator {orchestrator!r}: expected one of "
                         f"{', '.join(ORCHESTRATORS)}")
    with contextlib.ExitStack() as stack:
        if orchestrator == "dagster":
            daemon = _instance(site, postgres, keep_daemon=keep_daemon, stack=stack)
        else:
            daemon = "no Dagster"
        _serve(site, host, port, tenants, max_body_bytes, tick_s, orchestrator, daemon,
               uvicorn)


def _tokens():
    from fm_pipeline.api.auth import TokenStore, tokens_path

    return TokenStore(tokens_path(Site.from_environ()))


def _queue():
    from fm_pipeline.api.store import JobStore, queue_db_path

    return JobStore(queue_db_path(Site.from_environ()))


def _instance(site: Site, postgres: str | None, *, keep_daemon: bool, stack) -> str:
    """Write the instance's dagster.yaml, point DAGSTER_HOME at it, keep its daemon."""
    import os

    from fm_pipeline.deploy.instance import Postgres, Sqlite, write_instance
    from fm_pipeline.deploy.services import daemon, kept

    storage = Postgres(postgres) if postgres else Sqlite()
    home = write_instance(site.dagster_home, storage=storage)
    os.environ["DAGSTER_HOME"] = str(home)
    where = f"instance {home} ({'PostgreSQL' if postgres else 'sqlite'})"
    if not keep_daemon:
        return f"{where}; its daemon runs elsewhere"
    env = {**site.env(), "FM_LAUNCHER_ECHO": "0",
           "MLFLOW_LOGGING_LEVEL": "WARNING"}
    console.print(f"starting dagster-daemon for {where} ...", highlight=False)
    kept_daemon = stack.enter_context(kept(lambda: daemon(home, env=env)))
    shared = " (another fm's, shared)" if kept_daemon[0].shared else ""
    return f"{where}; dagster-daemon{shared} log {kept_daemon[0].log}"


def _serve(site: Site, host, port, tenants, max_body_bytes, tick_s, orchestrator, daemon,
           uvicorn):
    from fm_pipeline.api.app import create_app
    from fm_pipeline.api.auth import TokenStore, tokens_path
    from fm_pipeline.api.control_plane import ControlPlane
    from fm_pipeline.api.store import JobStore, queue_db_path
    from fm_pipeline.scheduling import load_tenants

    from fm_pipeline.launch.reaper import reap_orphans

    from fm_pipeline.failpoints import armed

    config = load_tenants(tenants)
    _check_launcher(config.launcher, orchestrator)
    if points := armed():  # a chaos run's (FM_FAILPOINTS); malformed ones refused here
        console.print(f"[yellow]fail points armed: {points}[/]", highlight=False)
    if reaped := reap_orphans():  # a killed server's segments left these behind
        console.print(f"ended {len(reaped)} process(es) left by segments whose launcher is "
                      "gone", highlight=False)
    tokens = TokenStore(tokens_path(site))
    plane = ControlPlane(tenants=config, orchestrator=_orchestrator(orchestrator, site),
                         store=JobStore(queue_db_path(site)), site=site)
    issued = tokens.entries()
    if plane.stranded:
        from fm_pipeline.api.control_plane import stranded_report

        console.print(f"[yellow]{stranded_report(plane.store, plane.stranded)}[/]",
                      highlight=False)
    console.print(
        f"fm-pipeline control plane on [bold]http://{host}:{port}[/] "
        f"(tenants {', '.join(config.tenant_names)}; pool {config.pool['gpu']} GPUs; "
        f"{len(issued)} API token(s); {orchestrator} orchestrator: {daemon})", highlight=False)
    if not issued:
        console.print("no API tokens yet: `fm api token issue --tenant NAME` (or --admin)")
    uvicorn.run(create_app(plane, tokens, max_body_bytes=max_body_bytes, tick_s=tick_s),
                host=host, port=port, log_config=_log_config())


ORCHESTRATORS = ("dagster", "local")


def _check_launcher(pool_launcher: str, orchestrator: str) -> None:
    """The pool's jobs are admitted for the launcher the tenants file names; the runs must
    go to that one (the Dagster definitions pick theirs from FM_LAUNCHER)."""
    import os

    runs_on = "local" if orchestrator == "local" else os.environ.get(
        "FM_LAUNCHER", "local").strip().lower()
    if runs_on != pool_launcher:
        raise ValueError(
            f"the tenants file's pool feeds the {pool_launcher} launcher (launcher: "
            f"{pool_launcher}), but this server's runs would go to the {runs_on} one "
            f"(--orchestrator {orchestrator}, FM_LAUNCHER={os.environ.get('FM_LAUNCHER', '')!r}): "
            "jobs would be admitted for one and run on the other; make them agree")


def _orchestrator(kind: str, site: Site):
    """The Dagster one comes from the Dagster layer: the API's core never imports dagster."""
    if kind == "local":
        from fm_pipeline.api.local_orchestrator import LocalOrchestrator

        from fm_pipeline.orchestration.retry import RetryPolicy

        backoff = os.environ.get("FM_RETRY_BACKOFF_S")  # as the Dagster path's policy reads it
        return LocalOrchestrator(
            site=site, policy=RetryPolicy.first_backoff(float(backoff)) if backoff else None)
    if kind == "dagster":
        from fm_pipeline.dagster_runs.orchestrator import DagsterOrchestrator

        return DagsterOrchestrator.for_project(site)
    raise ValueError(f"--orchestrator {kind!r}: expected one of {', '.join(ORCHESTRATORS)}")


@token_app.command("issue")
@user_errors
def issue(
    tenant: str = typer.Option(None, "--tenant", help="the tenant the token acts for"),
    admin: bool = typer.Option(False, "--admin", help="a token that acts on every job"),
    tenants: Path = typer.Option(None, "--tenants", help="tenants YAML (default: embedded)"),
) -> None:
    """Print a new token (shown once: only its SHA-256 is stored)."""
    from fm_pipeline.scheduling import load_tenants

    if admin == (tenant is not None):
        raise ValueError("give exactly one of --tenant NAME or --admin")
    if tenant is not None and tenant not in load_tenants(tenants).tenant_names:
        raise ValueError(f"unknown tenant {tenant!r}; tenants: "
                         f"{', '.join(load_tenants(tenants).tenant_names)}")
    token_id, token = _tokens().issue(tenant=tenant)
    console.print(f"token {token_id} for {'admin' if admin else 'tenant ' + tenant} "
                  "(shown once; keep it secret):", highlight=False)
    print(token)


@token_app.command("list")
def list_tokens() -> None:
    """Token ids and their tenants (never the tokens or hashes)."""

    for entry in _tokens().entries():
        print(f"{entry['id']}\t{entry['tenant'] or '(admin)'}")


@token_app.command("revoke")
@user_errors
def revoke(token_id: str = typer.Argument(..., help="the id from `fm api token list`")) -> None:

    if not _tokens().revoke(token_id):
        raise ValueError(f"no token {token_id}")
    console.print(f"revoked {token_id}")


@queue_app.command("list")
@user_errors
def queue_list(
    tenants: Path = typer.Option(None, "--tenants", help="tenants YAML (default: embedded)"),
) -> None:
    """Queued and running jobs per tenant; jobs of tenants the file no longer has are marked."""
    from fm_pipeline.scheduling import load_tenants

    known = set(load_tenants(tenants).tenant_names)
    store = _queue()
    try:
        for record in store.list():
            if record.queue_state == "done":
                continue
            state = "running" if record.queue_state == "admitted" else "queued"
            mark = "" if record.tenant in known else "\t(tenant not in the tenants file)"
            print(f"{record.job_id}\t{record.tenant}\t{state}\t{record.gpus} GPUs{mark}")
    finally:
        store.close()


@queue_app.command("drain")
@user_errors
def queue_drain(tenant: str = typer.Option(..., "--tenant", help="whose queued jobs to cancel")) -> None:
    """Cancel every queued job of a tenant (e.g. one removed from the tenants file); its
    running jobs are left to end. Serving control planes see it at their next verb."""
    from fm_pipeline.api.store import drain_tenant

    store = _queue()
    try:
        drained = drain_tenant(store, tenant)
    finally:
        store.close()
    console.print(f"cancelled {len(drained)} queued job(s) of tenant {tenant}"
                  + (f": {', '.join(drained)}" if drained else ""), highlight=False)


@kueue_app.command("render")
@user_errors
def kueue_render(
    tenants: Path = typer.Option(None, "--tenants", help="tenants YAML (default: embedded)"),
    out: Path = typer.Option(..., "--out", help="directory for the manifests"),
) -> None:
    """Write Namespaces, Topology, ResourceFlavor, WorkloadPriorityClasses, Cohort,
    ClusterQueues and LocalQueues, each validated strictly before anything is written."""
    from fm_pipeline.scheduling import load_tenants
    from fm_pipeline.scheduling.kueue import render_kueue

    objs = render_kueue(load_tenants(tenants))
    out.mkdir(parents=True, exist_ok=True)
    for i, obj in enumerate(objs):
        path = out / f"{i:02d}-{obj['kind'].lower()}-{obj['metadata']['name']}.yaml"
        path.write_text(yaml.safe_dump(obj, sort_keys=False), encoding="utf-8")
    console.print(f"wrote {len(objs)} objects to {out} (apply with `kubectl apply -f {out}`)")


if __name__ == "__main__":
    app()
