"""`fm`: the command-line face of fm-pipeline.

    fm data prepare --job configs/demo.yaml
    fm demo
    fm report demo-1

Each sub-command group lives in its own module and is registered here.
"""

from __future__ import annotations

import typer

from fm_pipeline.cli import api as api_cli
from fm_pipeline.cli import chaos as chaos_cli
from fm_pipeline.cli import ckpt as ckpt_cli
from fm_pipeline.cli import data as data_cli
from fm_pipeline.cli import demo as demo_cli
from fm_pipeline.cli import deploy as deploy_cli
from fm_pipeline.cli import dev as dev_cli
from fm_pipeline.cli import k8s as k8s_cli
from fm_pipeline.cli import plan as plan_cli
from fm_pipeline.cli import report as report_cli
from fm_pipeline.cli import simulate as simulate_cli

app = typer.Typer(
    name="fm",
    help="fm-pipeline: foundation-model pretraining, planned, checkpointed and resumable.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
app.add_typer(ckpt_cli.app, name="ckpt", help="List, validate, drill, export and retain checkpoints.")
app.add_typer(api_cli.app, name="api", help="The training-jobs REST API and its tenants.")
app.add_typer(data_cli.app, name="data", help="Prepare and inspect the training data mix.")
app.add_typer(k8s_cli.app, name="k8s", help="Kubernetes JobSet manifests for a segment.")
app.add_typer(plan_cli.app, name="plan", help="Plan layout, memory, MFU, reliability and cost.")
app.add_typer(simulate_cli.app, name="simulate", help="Simulate failures, checkpoints, stragglers and queues at cluster scale.")
app.add_typer(deploy_cli.app, name="deploy", help="The Dagster instance and its processes.")
app.add_typer(dev_cli.app, name="dev", help="A Kubernetes cluster on this machine for development and tests.")
app.add_typer(chaos_cli.app, name="chaos", help="Inject faults into real runs; straggler events and exclusions.")
app.command("demo", help="Run the main job end to end on the embedded defaults.")(demo_cli.demo)
app.command("report", help="Plot a training job (loss, step time, MFU, tokens/s, held-out loss) and summarise it.")(report_cli.report)


if __name__ == "__main__":
    app()
