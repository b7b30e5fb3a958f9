"""`fm k8s`: Kubernetes manifests for a training segment and for the data mix.

    fm k8s render --job configs/demo.yaml --out manifests/ --store-uri s3://bucket/fm
    kubectl apply -f manifests/          # ConfigMap, headless Service, JobSet (Kueue-queued)
    fm k8s render-data --job configs/demo.yaml --out data/ --store-uri s3://bucket/fm

Every object is validated strictly (unknown fields rejected, as `kubectl apply
--validate=strict` would) before anything is written; an invalid job spec writes nothing.
"""

from __future__ import annotations

import os
from pathlib import Path

import typer
from rich.console import Console

from fm_pipeline.cli.errors import user_errors
from fm_pipeline.cli.options import JOB
from fm_pipeline.launch.pod import FAST_HOST_PATH

app = typer.Typer(no_args_is_help=True)
console = Console()


@app.callback()
def k8s() -> None:
    """Kubernetes manifests for training segments (JobSet, queued by Kueue) and the data mix."""


@app.command("render")
@user_errors
def render(
    job: Path = JOB,
    out: Path = typer.Option(..., "--out", help="directory for the manifests"),
    end_step: int = typer.Option(0, "--end-step", help="segment end step (0: first segment)"),
    store_uri: str = typer.Option("", "--store-uri",
                                  help="object store s3://bucket/prefix (default $FM_STORE_URI)"),
    s3_endpoint: str = typer.Option("", "--s3-endpoint", help="S3 endpoint URL for the pods"),
    shared_volume_claim: str = typer.Option(
        "", "--shared-volume-claim",
        help="ReadWriteMany PVC shared by all nodes as the local checkpoint tier (optional)"),
    credentials_secret: str = typer.Option("", "--credentials-secret",
                                           help="Secret with AWS_* keys for the pods"),
    image: str = typer.Option("", "--image", help="container image (default: cluster.image)"),
    namespace: str = typer.Option("", "--namespace", help="default: cluster.namespace"),
    max_restarts: int = typer.Option(3, "--max-restarts",
                                     help="JobSet restarts for failures other than node loss"),
    required_topology: str = typer.Option("", "--required-topology",
                                          help="Kueue TAS: node label every pod must share"),
    preferred_topology: str = typer.Option("", "--preferred-topology",
                                           help="Kueue TAS: node label pods should share"),
    exclusive_topology: str = typer.Option("", "--exclusive-topology",
                                           help="JobSet exclusive placement topology key"),
    avoid_host: list[str] = typer.Option([], "--avoid-host", help="never schedule on this node"),
    fast_tier_host_path: str = typer.Option(
        FAST_HOST_PATH, "--fast-tier-host-path",
        help="node directory (in node memory) for the fast tier's snapshots when "
             "checkpoint.memory_every_steps > 0; '' keeps them in the pod's /dev/shm"),
    rack_label: str = typer.Option(
        "", "--rack-label",
        help="node label naming a node's failure domain (e.g. topology.kubernetes.io/zone): "
             "the fast tier's replicas go to another; writes the ClusterRole to read nodes"),
    overrides: list[str] = typer.Option([], "--set", help="job spec override dotted.key=value"),
) -> None:
    """Write the ConfigMap and JobSet of one training segment (and, with the fast tier on,
    the node keeper DaemonSet)."""
    from fm_pipeline.config import load_job, parse_overrides
    from fm_pipeline.launch.jobset import KubernetesTarget, render_segment
    from fm_pipeline.launch.pod import Placement
    from fm_pipeline.launch.spec import SegmentLaunch

    spec = load_job(job, **parse_overrides(overrides, where="--set"))
    step = end_step or spec.training.segment_end(0)
    target = KubernetesTarget(
        store_uri=store_uri or os.environ.get("FM_STORE_URI", ""),
        s3_endpoint_url=s3_endpoint or None,
        shared_volume_claim=shared_volume_claim or None,
        credentials_secret=credentials_secret or None,
        image=image or None,
        namespace=namespace or None,
        max_restarts=max_restarts,
        fast_tier_host_path=fast_tier_host_path,
        rack_label=rack_label,
        placement=Placement(
            required_topology=required_topology or None,
            preferred_topology=preferred_topology or None,
            exclusive_topology=exclusive_topology or None,
            avoid_hosts=tuple(avoid_host),
        ),
    )
    rendered = render_segment(SegmentLaunch(spec, end_step=step), target)
    for path in rendered.write(out):
        console.print(f"wrote {path}", highlight=False)
    from fm_pipeline.planner.job_plan import job_critique

    for finding in job_critique(spec):
        console.print(f"[yellow]warning:[/] {finding.field}: {finding.message} (suggested: "
                      f"{finding.suggested})", highlight=False)
    console.print(
        f"[green]segment {spec.name} -> step {step}[/]: JobSet {rendered.name} in namespace "
        f"{rendered.namespace}, {spec.parallelism.nnodes} node(s) x "
        f"{spec.parallelism.nproc_per_node} rank(s), queue {spec.cluster.local_queue}",
        highlight=False,
    )




@app.command("render-data")
@user_errors
def render_data(
    job: Path = JOB,
    out: Path = typer.Option(..., "--out", help="directory for the manifests"),
    store_uri: str = typer.Option("", "--store-uri",
                                  help="object store s3://bucket/prefix (default $FM_STORE_URI)"),
    s3_endpoint: str = typer.Option("", "--s3-endpoint", help="S3 endpoint URL for the pods"),
    credentials_secret: str = typer.Option("", "--credentials-secret",
                                           help="Secret with AWS_* keys for the pods"),
    image: str = typer.Option("", "--image", help="container image (default: cluster.image)"),
    namespace: str = typer.Option("", "--namespace", help="default: cluster.namespace"),
    step_cpu: str = typer.Option("1", "--step-cpu", help="CPU request of each step's pod"),
    step_memory: str = typer.Option("4Gi", "--step-memory",
                                    help="memory request and limit of each step's pod"),
    overrides: list[str] = typer.Option([], "--set", help="job spec override dotted.key=value"),
) -> None:
    """Write the run config of data_mix_job_k8s (each data task a Kubernetes Job, at most
    data.workers at once), the job spec's ConfigMap and the Job one step becomes."""
    from fm_pipeline.assets.data.k8s import check_k8s_run_config
    from fm_pipeline.config import load_job, parse_overrides
    from fm_pipeline.dagster_runs.data_k8s import DataK8sTarget, render_data_job

    spec = load_job(job, **parse_overrides(overrides, where="--set"))
    rendered = render_data_job(spec, DataK8sTarget(
        store_uri=store_uri or os.environ.get("FM_STORE_URI", ""),
        s3_endpoint_url=s3_endpoint or None, credentials_secret=credentials_secret or None,
        image=image or None, namespace=namespace or None, step_cpu=step_cpu,
        step_memory=step_memory))
    check_k8s_run_config(rendered.run_config)
    for path in rendered.write(out):
        console.print(f"wrote {path}", highlight=False)
    console.print(
        f"[green]data mix of {spec.name}[/]: data_mix_job_k8s in namespace {rendered.namespace}, "
        f"at most {spec.data.workers} step Job(s) at once; kubectl apply -f the ConfigMap, "
        f"then launch with the run config (dagster job launch -j data_mix_job_k8s -c "
        f"{out / 'data-run-config.yaml'})", highlight=False)
