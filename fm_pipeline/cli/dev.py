"""`fm dev cluster`: a Kubernetes cluster on this machine from the real components.

    fm dev cluster build      # etcd, kube-apiserver/-controller-manager/-scheduler, JobSet,
                              # Kueue from Go modules, once per set of versions (cached)
    fm dev cluster up         # start it: KUBECONFIG=.fm/dev-cluster/kubeconfig
    fm dev cluster status
    fm dev cluster down       # every process it started, its pods included

docs/kubernetes.md says what is real (everything but the node) and what the process
kubelet emulates.
"""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.console import Console

from fm_pipeline.cli.errors import user_errors

app = typer.Typer(no_args_is_help=True, pretty_exceptions_enable=False)
cluster_app = typer.Typer(no_args_is_help=True, pretty_exceptions_enable=False)
app.add_typer(cluster_app, name="cluster", help="A Kubernetes cluster on 127.0.0.1, "
              "real control plane and controllers, pods as processes.")
console = Console()

CACHE = typer.Option(None, "--cache", envvar="FM_KUBE_CACHE",
                     help="where built components are kept (default ~/.cache/fm-pipeline/kube)")
STATE = typer.Option(None, "--state", help="the cluster's folder (default FM_HOME/dev-cluster)")


def _state(state: Path | None) -> Path:
    from fm_pipeline.config.site import Site

    return state or Site.from_environ().home / "dev-cluster"


def _build(cache: Path | None):
    from fm_pipeline.devcluster.build import build_components, default_cache

    return build_components(cache or default_cache(),
                            log=lambda line: console.print(f"[dim]{line}[/]"))


@cluster_app.command("build")
@user_errors
def build(cache: Path = CACHE) -> None:
    """Build (or find) the components; prints where they are."""
    components = _build(cache)
    console.print(f"components in {components.root}")
    for module, version in sorted(components.versions.items()):
        console.print(f"  {module} {version}")


@cluster_app.command("up")
@user_errors
def up(cache: Path = CACHE, state: Path = STATE,
       nodes: int = typer.Option(2, "--nodes", min=1, max=16),
       gpus: int = typer.Option(2, "--gpus-per-node", min=0,
                                help="advertised nvidia.com/gpu per node (no device behind)"),
       tenants: Path = typer.Option(None, "--tenants",
                                    help="tenants whose Kueue objects to apply (default: "
                                         "fm_pipeline/defaults/dev_cluster_tenants.yaml)")) -> None:
    """Start the cluster and leave it running (`fm dev cluster down` stops it)."""
    from fm_pipeline.defaults import DEV_CLUSTER_TENANTS
    from fm_pipeline.devcluster.cluster import DevCluster, default_nodes
    from fm_pipeline.scheduling.tenants import load_tenants

    components = _build(cache)
    cluster = DevCluster(components, _state(state), nodes=default_nodes(nodes, gpus=gpus),
                         tenants=load_tenants(tenants or DEV_CLUSTER_TENANTS), attached=False)
    with console.status("starting") as status:
        info = cluster.up(progress=lambda step: status.update(f"starting {step}"))
    console.print(f"dev cluster up: {info.server}, nodes {', '.join(info.nodes)}")
    console.print(f"  export KUBECONFIG={info.kubeconfig}")


@cluster_app.command("status")
@user_errors
def status_cmd(state: Path = STATE,
               as_json: bool = typer.Option(False, "--json")) -> None:
    """What runs: processes, nodes, the apiserver's version."""
    from fm_pipeline.devcluster.cluster import status

    report = status(_state(state))
    if as_json:
        typer.echo(json.dumps(report, indent=1))
        return
    if not report["up"]:
        console.print(f"no dev cluster runs from {report['state']}")
        raise typer.Exit(1)
    console.print(f"up: {report['server']} ({report['processes']} processes), "
                  f"KUBECONFIG={report['kubeconfig']}")
    for node, ready in report.get("nodes", {}).items():
        console.print(f"  {node}: Ready={ready}")
    if "error" in report:
        console.print(f"[red]{report['error']}[/]")


@cluster_app.command("down")
@user_errors
def down_cmd(state: Path = STATE) -> None:
    """Stop every process the cluster started (its pods too); its folder stays."""
    from fm_pipeline.devcluster.cluster import down

    ended = down(_state(state))
    console.print(f"dev cluster down ({len(ended)} processes ended)" if ended
                  else "no dev cluster was running")
