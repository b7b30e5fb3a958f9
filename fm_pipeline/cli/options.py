"""Options several `fm` commands share, declared once."""

from __future__ import annotations

import typer

from fm_pipeline.defaults import DEMO_JOB

JOB = typer.Option(DEMO_JOB, "--job", "-j", show_default=False,
                   help="job spec YAML (default: the embedded demo spec, configs/demo.yaml)")
