"""The data area's Dagster definitions: the four data assets, their checks, `data_mix_job`.

    dagster dev -w workspace.yaml        # group "data": clean_documents -> ... -> data_mix
    fm demo                              # materializes data_mix_job in the project instance

Resources: "store" (ObjectStoreResource) and "job_spec" (JobSpecResource, default
configs/demo.yaml). Downstream areas take `data_mix` (a MixRef) as an input.
"""

from __future__ import annotations

from dagster import (
    AssetSelection,
    Definitions,
    ExecutorDefinition,
    Permissive,
    define_asset_job,
    multi_or_in_process_executor,
)
from dagster._core.definitions.executor_definition import multiple_process_executor_requirements
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




def _k8s_job_executor(init_context):
    # Imported when a run starts: dagster-k8s brings the kubernetes client (~0.8 s), which
    # every other process loading the code location would pay.
    from dagster_k8s import k8s_job_executor

    return k8s_job_executor.executor_creation_fn(init_context)


# Past one machine: each step a Kubernetes Job (dagster-k8s's k8s_job_executor, its config
# checked against that executor's own schema by `fm k8s render-data`, fm_pipeline/dagster_runs/data_k8s.py).
k8s_executor = ExecutorDefinition(
    name="k8s", config_schema=Permissive(), executor_creation_fn=_k8s_job_executor,
    requirements=multiple_process_executor_requirements(),
    description="dagster-k8s's k8s_job_executor, imported when a run starts")
data_mix_job_k8s = define_asset_job(
    "data_mix_job_k8s", executor_def=k8s_executor, selection=AssetSelection.groups(GROUP),
    description="data_mix_job with each step a Kubernetes Job (fm k8s render-data writes its "
                "run config).",
)

CODE_LOCATION = "fm_pipeline.definitions"  # what workspace.yaml loads
STEP_PRELOAD = "fm_pipeline.assets.data.step_preload"


def data_run_config(job) -> dict:
    """The executor part of a data_mix_job run's config for a job spec."""
    workers = job.data.workers
    if workers <= 1:
        return {"execution": {"config": {"in_process": {}}}}
    # forkserver: each step forks a process that has the code location imported, instead of
    # a fresh interpreter paying the imports per step (Dagster's default, spawn). Named:
    # Dagster preloads the module a job came from, which is not the code location when the
    # job runs from a script (a benchmark, execute_job), and each step then paid ~1.3 s.
    # STEP_PRELOAD brings what the steps import themselves (Dagster's instance storage,
    # Great Expectations): ~0.4 s more per step, ~3 s per check step.
    return {"execution": {"config": {"multiprocess": {
        "max_concurrent": workers,
        "start_method": {"forkserver": {"preload_modules": [CODE_LOCATION, STEP_PRELOAD]}}}}}}


defs = Definitions(
    assets=DATA_ASSETS,
    asset_checks=DATA_CHECKS,
    jobs=[data_mix_job, data_mix_job_k8s],
    resources={"store": ObjectStoreResource(), "job_spec": JobSpecResource()},
)
