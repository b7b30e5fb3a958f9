"""The Dagster instance fm-pipeline runs on: its dagster.yaml and workspace.yaml.

    home = write_instance(site.dagster_home)                      # sqlite under the site's home
    home = write_instance(path, storage=Postgres("postgresql://fm@127.0.0.1:5433/dagster"))
    config = instance_config(launcher=K8sRunLauncher(namespace="training", image="fm:1"))

One execution path, the daemon's: every run is submitted to the QueuedRunCoordinator, which
launches it with the run launcher when a slot is free. At most one segment run per training
job is in flight (a tag concurrency limit on `fm/segment_of`, which every segment run
carries), so two control planes, a webserver and a daemon on one instance can never train one
job twice. Run monitoring fails a run whose worker died (the local run launcher reports the
worker's health, fm_pipeline.resources.run_launcher), and the failure sensor then resumes
it. Storage: sqlite in DAGSTER_HOME by default; PostgreSQL (dagster-postgres) for a
deployment. Past one machine the run launcher is dagster-k8s's K8sRunLauncher: each run
is a Kubernetes Job in the run namespace (the segment itself is still a JobSet).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from fm_pipeline.storage.durable import atomic_write

SEGMENT_OF_TAG = "fm/segment_of"  # on every segment run: the training job it trains
JOB_TAG = "fm/job"  # on every run of a training job (segments, evaluations, drills, data)
CODE_LOCATION = "fm_pipeline"  # the workspace's location name (submit_over_graphql uses it)


@dataclass(frozen=True)
class Sqlite:
    """Run, event and schedule storage in DAGSTER_HOME (Dagster's default)."""


@dataclass(frozen=True)
class Postgres:
    url: str  # postgresql://user[:password]@host:port/database

    def config(self) -> dict:
        # The driver dagster-postgres ships with: SQLAlchemy >= 2.1 maps a bare
        # postgresql:// to psycopg 3, which is not installed.
        url = self.url
        if url.startswith(("postgresql://", "postgres://")):
            url = "postgresql+psycopg2://" + url.split("://", 1)[1]
        return {"postgres": {"postgres_url": url}}


@dataclass(frozen=True)
class LocalRunLauncher:
    """Each run a process on this machine (Dagster's default launcher, plus worker health)."""

    def config(self) -> dict:
        return {"module": "fm_pipeline.resources.run_launcher", "class": "LocalRunLauncher"}


@dataclass(frozen=True)
class K8sRunLauncher:
    """dagster-k8s: each run a Kubernetes Job (its step runs the segment's JobSet)."""

    namespace: str
    image: str
    service_account: str = "fm-dagster"
    instance_config_map: str = "fm-dagster-instance"
    env_secrets: tuple[str, ...] = ()
    env_config_maps: tuple[str, ...] = ()
    extra: dict = field(default_factory=dict)

    def config(self) -> dict:
        cfg: dict[str, Any] = {
            "job_namespace": self.namespace, "job_image": self.image,
            "service_account_name": self.service_account,
            "instance_config_map": self.instance_config_map,
            "image_pull_policy": "IfNotPresent", "load_incluster_config": True,
        }
        if self.env_secrets:
            cfg["env_secrets"] = list(self.env_secrets)
        if self.env_config_maps:
            cfg["env_config_maps"] = list(self.env_config_maps)
        return {"module": "dagster_k8s", "class": "K8sRunLauncher", "config": {**cfg,
                                                                               **self.extra}}


def instance_config(*, storage: Sqlite | Postgres = Sqlite(),
                    launcher: LocalRunLauncher | K8sRunLauncher = LocalRunLauncher(),
                    max_concurrent_runs: int = 4, monitor_every_s: int = 5,
                    one_run_per_job: bool | None = None) -> dict:
    """dagster.yaml as a dict. `max_concurrent_runs`: runs launched at once (segments,
    evaluations, drills); a training job has at most one segment run among them.
    `one_run_per_job` (default: on one machine): a job's evaluations and drills wait for its
    segment too, instead of sharing the machine with it (on a cluster they run elsewhere)."""
    if max_concurrent_runs < 1:
        raise ValueError(f"max_concurrent_runs must be >= 1, got {max_concurrent_runs}")
    if one_run_per_job is None:
        one_run_per_job = isinstance(launcher, LocalRunLauncher)
    limits = [{"key": SEGMENT_OF_TAG, "limit": 1, "value": {"applyLimitPerUniqueValue": True}}]
    if one_run_per_job:
        limits.append({"key": JOB_TAG, "limit": 1, "value": {"applyLimitPerUniqueValue": True}})
    config: dict[str, Any] = {
        "telemetry": {"enabled": False},
        "run_coordinator": {
            "module": "dagster.core.run_coordinator", "class": "QueuedRunCoordinator",
            "config": {
                "max_concurrent_runs": max_concurrent_runs,
                "dequeue_interval_seconds": 1,
                "tag_concurrency_limits": limits,
            },
        },
        "run_launcher": launcher.config(),
        # Each sensor ticks on its own thread: evaluated one after another, a resume or the
        # next segment waited behind the others' ticks (2-5 s seen on 2 cores).
        "sensors": {"use_threads": True, "num_workers": 4},
        "run_monitoring": {
            "enabled": True, "start_timeout_seconds": 300, "cancel_timeout_seconds": 300,
            "poll_interval_seconds": monitor_every_s, "max_resume_run_attempts": 0,
        },
    }
    if isinstance(storage, Postgres):
        config["storage"] = storage.config()
    return config


def workspace_config() -> dict:
    """The code location every Dagster process of the deployment loads."""
    return {"load_from": [{"python_module": {"module_name": "fm_pipeline.definitions",
                                             "location_name": CODE_LOCATION}}]}


def write_instance(home: Path, **kwargs) -> Path:
    """Write `home`/dagster.yaml and `home`/workspace.yaml (kwargs: instance_config's);
    returns `home`. Rewritten each time: the file is the product's, not hand-edited."""
    home = Path(home)
    home.mkdir(parents=True, exist_ok=True)
    # Whole or not at all: another fm process (a second API server) may be reading it.
    atomic_write(home / "dagster.yaml", yaml.safe_dump(instance_config(**kwargs),
                                                       sort_keys=False).encode())
    atomic_write(home / "workspace.yaml", yaml.safe_dump(workspace_config(),
                                                         sort_keys=False).encode())
    return home
