"""The data area's Dagster definitions: the four data assets, their checks, `data_mix_job`.

    dagster dev -w workspace.yaml        # group "data": clean_documents -> ... -> data_mix
    fm demo                              # materializes data_mix_job in the project instance

Resources: "store" (ObjectStoreResource) and "job_spec" (JobSpecResource, default
configs/demo.yaml). Downstream areas take `data_mix` (a MixRef) as an input.
"""

from __future__ import annotations

from dagster import AssetSelection, Definitions, define_asset_job, in_process_executor
from fm_pipeline.assets.data.checks import DATA_CHECKS
from fm_pipeline.assets.data.mix import GROUP, clean_documents, data_mix, token_shards, tokenizer
from fm_pipeline.resources.job_spec import JobSpecResource
from fm_pipeline.resources.store import ObjectStoreResource

DATA_ASSETS = [clean_documents, tokenizer, token_shards, data_mix]

# In process: the stages run one after the other, and a process per step would pay the
# imports (Great Expectations alone ~3.6 s) four times.
data_mix_job = define_asset_job(
    "data_mix_job", executor_def=in_process_executor,
    selection=AssetSelection.groups(GROUP),
    description="Prepare the job's data mix: clean, tokenize, shard, publish, with blocking checks.",
)

defs = Definitions(
    assets=DATA_ASSETS,
    asset_checks=DATA_CHECKS,
    jobs=[data_mix_job],
    resources={"store": ObjectStoreResource(), "job_spec": JobSpecResource()},
)
