"""data_mix_job_k8s's run config checked as Dagster checks it at launch: against the job with
dagster-k8s's k8s_job_executor and its own config schema (the code location's job defers that
import to its runs, so its executor config is not checked until then)."""

from dagster import AssetSelection, Definitions, define_asset_job, validate_run_config
from fm_pipeline.assets.data import DATA_ASSETS, GROUP, defs


def check_k8s_run_config(run_config: dict) -> None:
    """Raise DagsterInvalidConfigError naming what the executor or the resources refuse."""
    from dagster_k8s import k8s_job_executor

    job = define_asset_job("data_mix_job_k8s", executor_def=k8s_job_executor,
                           selection=AssetSelection.groups(GROUP))
    checked = Definitions(assets=DATA_ASSETS, asset_checks=defs.asset_checks, jobs=[job],
                          resources=defs.resources)
    validate_run_config(checked.resolve_job_def("data_mix_job_k8s"), run_config)
