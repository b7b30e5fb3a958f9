"""The tests' Site, built as an entry point builds it: from the environment the fm_home
fixture set (config.site). Shorthands for what tests look at."""

from __future__ import annotations

from pathlib import Path

from fm_pipeline.config.site import Site


def site() -> Site:
    return Site.from_environ()


def runs_dir(job_name: str) -> Path:
    return site().runs_dir(job_name)


def local_root(job_name: str) -> Path:
    return site().checkpoints_dir(job_name)


def store_uri() -> str:
    return site().store_uri


def root_of(job) -> Path:
    """The local checkpoint tier of `job` (a JobSpec or a job's name)."""
    return local_root(job if isinstance(job, str) else job.name)


def token_store():
    from fm_pipeline.api.auth import TokenStore, tokens_path

    return TokenStore(tokens_path(site()))


def job_store():
    from fm_pipeline.api.store import JobStore, queue_db_path

    return JobStore(queue_db_path(site()))
