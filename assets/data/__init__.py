"""The data area's Dagster definitions: the four data assets, their checks, `data_mix_job`.

    dagster dev -w workspace.yaml        # group "data": clean_documents -> ... -> data_mix
    fm demo                              # materializes data_mix_job in the project instance

Resources: "store" (ObjectStoreResource) and "job_spec" (JobSpecResource, default
configs/demo.yaml). Downstream areas take `data_mix` (a MixRef) as an input.
"""

from __future__ import annotations

from dagster import AssetSelection, Definitions, define_asset_job, multi_or_in_process_executor
from fm_pipeline.assets.data.checks import DATA_CHECKS
from fm_pipeline.assets.data.mix import GROUP, clean_documents, data_mix, token_shards, tokenizer
from fm_pipeline.resources.job_spec import JobSpecResource
from fm_pipeline.resources.store import ObjectStoreResource

DATA_ASSETS = [clean_documents, tokenizer, token_shards, data_mix]

# The run config picks the executor: `in_process` (the stages one after the other; a
# process per step would pay the imports, Great Expectations alone ~3.6 s, at every step)
# or `multiprocess` with max_concurrent = the job spec's data.workers, which fans the
# cleaning tasks out (data_run_config; Dagster's default when a run names none).
data_mix_job = define_asset_job(
    "data_mix_job", executor_def=multi_or_in_process_executor,
    selection=AssetSelection.groups(GROUP),
    description="Prepare the job's data mix: clean, tokenize, shard, publish, with blocking checks.",
)


CODE_LOCATION = "fm_pipeline.definitions"  # what workspace.yaml loads


def data_run_config(job) -> dict:
    """The executor part of a data_mix_job run's config for a job spec."""
    workers = job.data.workers
    if workers <= 1:
        return {"execution": {"config": {"in_process": {}}}}
    # forkserver: each step forks a process that has the code location imported, instead of
    # a fresh interpreter paying the imports per step (Dagster's default, spawn). Named:
    # Dagster preloads the module a job came from, which is not the code location when the
    # job runs from a script (a benchmark, execute_job), and each step then paid ~1.3 s.
    return {"execution": {"config": {"multiprocess": {
        "max_concurrent": workers,
        "start_method": {"forkserver": {"preload_modules": [CODE_LOCATION]}}}}}}


defs = Definitions(
    assets=DATA_ASSETS,
    asset_checks=DATA_CHECKS,
    jobs=[data_mix_job],
    resources={"store": ObjectStoreResource(), "job_spec": JobSpecResource()},
)
