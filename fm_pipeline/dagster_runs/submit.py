"""Submitting a training job programmatically (the REST API, scripts, the demo).

With the instance (the daemon's intake sensor then starts the run):

    register_training_job(instance, job, store=store)       # spec + partition
    submit_run(store, job, tags={"fm/api_job_id": "42"})    # orchestration.submissions

Against a running deployment (`dagster dev` / webserver on host:port):

    run_id = submit_over_graphql(job, store=store, site=site, url="http://127.0.0.1:3000",
                                 tags={"fm/api_job_id": "42"})

Either way the sensors then carry the job to its target step (next segments, resumes).
A run's tags name its job (dagster/partition = the job name) and why it ran (fm/trigger).
"""

from __future__ import annotations

from collections.abc import Mapping

from dagster import RunRequest
from fm_pipeline.dagster_runs.names import JOBS_PARTITION, PARTITION_TAG, SEGMENT_JOB
from fm_pipeline.dagster_runs.requests import SUBMIT, segment_request

from fm_pipeline.orchestration import register_job
from fm_pipeline.orchestration.segments import plan_segment

DEFAULT_LOCATION = "fm_pipeline"  # workspace.yaml's location_name

_ADD_PARTITION = """
mutation AddPartition($selector: RepositorySelector!, $name: String!, $key: String!) {
  addDynamicPartition(repositorySelector: $selector, partitionsDefName: $name,
                      partitionKey: $key) {
    __typename
    ... on PythonError { message }
    ... on UnauthorizedError { message }
  }
}"""


def register_training_job(instance, job, *, store) -> str:
    """Store the job's spec and add its partition (idempotent); returns the spec's URI."""
    location = register_job(store, job)
    if not instance.has_dynamic_partition(JOBS_PARTITION, job.name):
        instance.add_dynamic_partitions(JOBS_PARTITION, [job.name])
    return location


def first_segment_request(job, *, store, site, tags: Mapping[str, str] | None = None,
                          fail_at: str = "") -> RunRequest:
    """The segment a (re)submitted job starts with: from its newest valid checkpoint."""
    return segment_request(job, plan_segment(job, store, site=site), trigger=SUBMIT, tags=tags,
                           fail_at=fail_at)


def submit_over_graphql(job, *, store, site, url: str, tags: Mapping[str, str] | None = None,
                        location: str = DEFAULT_LOCATION, timeout_s: float = 30.0) -> str:
    """Register the job, add its partition and launch its first segment through the
    webserver's GraphQL API; returns the Dagster run id."""
    import httpx
    from dagster_graphql import DagsterGraphQLClient

    register_job(store, job)
    selector = {"repositoryLocationName": location, "repositoryName": "__repository__"}
    reply = httpx.post(f"{url.rstrip('/')}/graphql", timeout=timeout_s, json={
        "query": _ADD_PARTITION,
        "variables": {"selector": selector, "name": JOBS_PARTITION, "key": job.name}})
    reply.raise_for_status()
    added = reply.json()["data"]["addDynamicPartition"]
    if added["__typename"] not in ("AddDynamicPartitionSuccess", "DuplicateDynamicPartitionError"):
        raise RuntimeError(f"adding partition {job.name!r} failed: {added}")
    request = first_segment_request(job, store=store, site=site, tags=tags)
    parsed = httpx.URL(url)
    client = DagsterGraphQLClient(parsed.host, port_number=parsed.port, timeout=int(timeout_s))
    return client.submit_job_execution(
        SEGMENT_JOB, repository_location_name=location, repository_name="__repository__",
        run_config=request.run_config,
        tags={**request.tags, PARTITION_TAG: job.name})
