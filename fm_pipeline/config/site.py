"""Where one installation keeps its state: a `Site`, built once at each entry point and
passed down (no module below the entry points reads the environment for paths or stores).

    .fm/store/        the default object store (data mix, tokenizers, checkpoints)
    .fm/runs/<job>/   local checkpoint tier, segment logs, the job's event log
    .fm/dagster/      DAGSTER_HOME (sqlite)
    .fm/mlflow.db     MLflow tracking store
    .fm/api/          the control plane's queue and tokens
    .fm/cache/        data shards fetched from a remote store

Entry points (the `fm` CLI, the torchrun worker, the eval and drill workers, the API
server, the Dagster resources) call `Site.from_environ()`: FM_HOME (default ./.fm),
FM_STORE_URI, FM_MLFLOW_URI and DAGSTER_HOME override each; FM_S3_ENDPOINT_URL names the
S3 service of its s3:// stores. A process they start gets
`site.env()` and builds the same Site.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from fm_pipeline.storage import ObjectStore, open_store

HOME_ENV, STORE_ENV, TRACKING_ENV, DAGSTER_ENV, S3_ENDPOINT_ENV = (
    "FM_HOME", "FM_STORE_URI", "FM_MLFLOW_URI", "DAGSTER_HOME", "FM_S3_ENDPOINT_URL")
SITE_ENV = (HOME_ENV, STORE_ENV, TRACKING_ENV, DAGSTER_ENV, S3_ENDPOINT_ENV)


@dataclass(frozen=True)
class Site:
    home: Path
    store_uri: str
    tracking_uri: str
    dagster_home: Path
    # The S3 service of every s3:// store this site opens (None: the AWS SDK's own
    # configuration, AWS_ENDPOINT_URL_S3 or ~/.aws/config).
    s3_endpoint: str | None = None

    @classmethod
    def at(cls, home: str | Path, *, store_uri: str | None = None,
           tracking_uri: str | None = None, dagster_home: str | Path | None = None,
           s3_endpoint: str | None = None) -> Site:
        """Everything under `home` unless named otherwise."""
        home = Path(home).resolve()
        return cls(home=home, store_uri=store_uri or str(home / "store"),
                   tracking_uri=tracking_uri or f"sqlite:///{home / 'mlflow.db'}",
                   dagster_home=Path(dagster_home) if dagster_home else home / "dagster",
                   s3_endpoint=s3_endpoint or None)

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> Site:
        """The one reader of the site's variables: entry points only."""
        env = os.environ if environ is None else environ
        return cls.at(env.get(HOME_ENV) or Path.cwd() / ".fm", store_uri=env.get(STORE_ENV),
                      tracking_uri=env.get(TRACKING_ENV), dagster_home=env.get(DAGSTER_ENV),
                      s3_endpoint=env.get(S3_ENDPOINT_ENV))

    @property
    def runs_root(self) -> Path:
        return self.home / "runs"

    def runs_dir(self, job_name: str) -> Path:
        return self.runs_root / job_name

    def checkpoints_dir(self, job_name: str) -> Path:
        """The job's local checkpoint tier (catalog.refs describes what is in it)."""
        return self.runs_dir(job_name) / "checkpoints"

    @property
    def api_dir(self) -> Path:
        return self.home / "api"

    def data_cache(self, mix_key: str) -> Path:
        """Where shards of mix `mix_key` fetched from a remote store are kept."""
        return self.home / "cache" / "data" / mix_key

    def store(self) -> ObjectStore:
        return self.open_store(self.store_uri)

    def open_store(self, uri: str | Path) -> ObjectStore:
        """Another store (a `--store` option, a checkpoint's), on this site's S3 service."""
        return open_store(uri, endpoint_url=self.s3_endpoint)

    def with_store(self, store_uri: str | None, *, s3_endpoint: str | None = None) -> Site:
        """The same site with another object store (a `--store` option) or S3 service (an
        `--endpoint-url`); None keeps the site's."""
        return replace(self, store_uri=store_uri or self.store_uri,
                       s3_endpoint=s3_endpoint or self.s3_endpoint)

    def env(self) -> dict[str, str]:
        """What a child process needs to build this same Site at its entry point. The
        tracking URI only when it is not the home's default: a trainer that sees
        FM_MLFLOW_URI logs its segment there (train.tracking), which an orchestrator asks
        for per segment (tracking.JobTracker.trainer_env), not every launch."""
        env = {HOME_ENV: str(self.home), STORE_ENV: self.store_uri,
               DAGSTER_ENV: str(self.dagster_home)}
        if self.s3_endpoint:
            env[S3_ENDPOINT_ENV] = self.s3_endpoint
        if self.tracking_uri != Site.at(self.home).tracking_uri:
            env[TRACKING_ENV] = self.tracking_uri
        return env
