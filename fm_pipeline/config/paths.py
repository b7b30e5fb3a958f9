"""Where state lives on one machine: a project-local FM_HOME (default ./.fm).

    .fm/store/        the default object store (data mix, tokenizers, checkpoints)
    .fm/runs/<job>/   local checkpoint tier and segment logs
    .fm/dagster/      DAGSTER_HOME (sqlite)
    .fm/mlflow.db     MLflow tracking store
Environment variables override each: FM_HOME, FM_STORE_URI, FM_MLFLOW_URI.
"""

from __future__ import annotations

import os
from pathlib import Path


def fm_home() -> Path:
    return Path(os.environ.get("FM_HOME", Path.cwd() / ".fm")).resolve()


def store_uri() -> str:
    return os.environ.get("FM_STORE_URI") or str(fm_home() / "store")


def runs_dir(job_name: str) -> Path:
    return fm_home() / "runs" / job_name


def dagster_home() -> Path:
    return Path(os.environ.get("DAGSTER_HOME", fm_home() / "dagster"))


def mlflow_uri() -> str:
    return os.environ.get("FM_MLFLOW_URI") or f"sqlite:///{fm_home() / 'mlflow.db'}"
