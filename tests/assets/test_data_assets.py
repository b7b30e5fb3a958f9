"""The data assets through Dagster: definitions load, a materialization records metadata
and passing checks, and a failing blocking check stops everything downstream."""

from __future__ import annotations

import pytest
import yaml
from dagster import DagsterInstance, materialize
from fm_pipeline.assets.data import DATA_ASSETS, DATA_CHECKS
from fm_pipeline.resources.job_spec import JobSpecResource
from fm_pipeline.resources.store import ObjectStoreResource

from fm_pipeline.data import MixRef, mix_key, pipeline
from fm_pipeline.data.corpus import ShardsReceipt, read_receipt, write_receipt
from fm_pipeline.data.manifest import ShardEntry, manifest_key, shards_receipt_key
from fm_pipeline.data.testing import SMALL_JOB, small_job
from fm_pipeline.storage import open_store


@pytest.fixture
def job_yaml(tmp_path):
    path = tmp_path / "small.yaml"
    path.write_text(yaml.safe_dump(SMALL_JOB))
    return path


def run_data_assets(job_yaml, store_dir):
    return materialize(
        [*DATA_ASSETS, *DATA_CHECKS],
        instance=DagsterInstance.ephemeral(),
        resources={"job_spec": JobSpecResource(path=str(job_yaml)),
                   "store": ObjectStoreResource(uri=str(store_dir))},
        raise_on_error=False,
    )


def test_definitions_load_with_the_data_job():
    from dagster import Definitions

    import fm_pipeline.definitions as location
    from fm_pipeline.definitions import defs

    # `dagster dev` refuses a module with several Definitions objects at module scope.
    assert [v for v in vars(location).values() if isinstance(v, Definitions)] == [defs]

    job = defs.resolve_job_def("data_mix_job")
    assert {"clean_documents", "tokenizer", "token_shards", "data_mix"} <= set(job.graph.node_names())
    graph = defs.resolve_asset_graph()
    checks = {k.name for k in graph.asset_check_keys}
    assert {"token_ids_below_vocab", "no_empty_shards", "shards_within_token_limit",
            "weights_sum_to_one",
            "source_counts_match_manifest", "dedup_ratio"} <= checks


def test_materialization_publishes_the_mix_with_metadata_and_checks(job_yaml, tmp_path):
    result = run_data_assets(job_yaml, tmp_path / "store")
    assert result.success
    evaluations = {e.check_name: e for e in result.get_asset_check_evaluations()}
    assert len(evaluations) == 8 and all(e.passed for e in evaluations.values())
    ref = result.output_for_node("data_mix")
    assert isinstance(ref, MixRef) and ref.key == mix_key(small_job())
    assert ref.open().samples(0, 2).shape == (2, 33)
    clean_meta = result.asset_materializations_for_node("clean_documents")[0].metadata
    assert clean_meta["dropped_by_reason"].value == {"code": {}, "prose": {"empty": 1}}
    mix_meta = result.asset_materializations_for_node("data_mix")[0].metadata
    assert mix_meta["samples"].value == len(ref.open())


def test_failing_blocking_check_stops_downstream(job_yaml, tmp_path):
    store_dir = tmp_path / "store"
    store, job = open_store(store_dir), small_job()
    for stage in (pipeline.clean_stage, pipeline.tokenizer_stage, pipeline.shards_stage):
        stage(job, store)
    # A shard stage that (wrongly) recorded an empty shard: token_shards re-uses its receipt.
    key = mix_key(job)
    receipt = read_receipt(store, shards_receipt_key(key), ShardsReceipt)
    empty = ShardEntry(key=f"data/{key}/shards/prose/train-00099.bin", split="train", tokens=0,
                       bytes=0, sha256="e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855")
    store.put_bytes(b"", empty.key)
    write_receipt(store, shards_receipt_key(key),
                  receipt.model_copy(update={"shards": {**receipt.shards, "prose": [*receipt.shards["prose"], empty]}}))

    result = run_data_assets(job_yaml, store_dir)
    assert not result.success
    evaluations = {e.check_name: e for e in result.get_asset_check_evaluations()}
    assert evaluations["no_empty_shards"].passed is False
    assert "1 empty" in evaluations["no_empty_shards"].description
    assert not result.asset_materializations_for_node("data_mix")  # skipped
    assert not store.exists(manifest_key(key))  # nothing published


def data_mix_job_def():
    """The project's data_mix_job, reconstructable in the multiprocess executor's children."""
    from fm_pipeline.definitions import defs

    return defs.resolve_job_def("data_mix_job")


def test_the_step_preload_imports_what_steps_open():
    """The forkserver drops a preload module that fails to import without a word, and every
    step would then pay the imports again: the module must import, in a fresh interpreter,
    and bring Dagster's instance storage and Great Expectations with it."""
    import importlib
    import subprocess
    import sys

    from fm_pipeline.assets.data import STEP_PRELOAD

    probe = (f"import sys, {STEP_PRELOAD} as p; "
             "print(all(m in sys.modules for m in p.MODULES))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "True"
    for module in ("great_expectations", "dagster._core.storage.sqlite_storage", "tokenizers"):
        assert module in importlib.import_module(STEP_PRELOAD).MODULES


def test_cleaning_tasks_fan_out_over_two_processes(tmp_path):
    """data.workers = 2 -> the multiprocess executor runs the cleaning tasks as separate
    processes, two at a time, to the same clean corpus as the stages run in-process."""
    import itertools

    from dagster import AssetKey, DagsterEventType, execute_job, instance_for_test, reconstructable
    from fm_pipeline.assets.data import data_run_config

    overrides = {"data.task_bytes": 300_000, "data.workers": 2}
    job = small_job(**overrides)
    spec = dict(SMALL_JOB, data={**SMALL_JOB["data"], "task_bytes": 300_000, "workers": 2})
    path = tmp_path / "tasks.yaml"
    path.write_text(yaml.safe_dump(spec))
    run_config = {**data_run_config(job), "resources": {
        "job_spec": {"config": {"path": str(path)}},
        "store": {"config": {"uri": str(tmp_path / "store")}}}}
    executor = run_config["execution"]["config"]["multiprocess"]
    assert executor["max_concurrent"] == 2
    # Steps fork from a server that imported the code location and what steps need once,
    # wherever the job came from (this test module, a benchmark script, the code server).
    assert executor["start_method"]["forkserver"]["preload_modules"] == [
        "fm_pipeline.definitions", "fm_pipeline.assets.data.step_preload"]
    (tmp_path / "dagster").mkdir()
    with instance_for_test(temp_dir=str(tmp_path / "dagster")) as instance:
        result = execute_job(reconstructable(data_mix_job_def), instance=instance,
                             run_config=run_config, asset_selection=[AssetKey("clean_documents")])
        assert result.success
        events = instance.all_logs(result.run_id)
    steps = {}
    for e in events:
        d = e.dagster_event
        if d is None or not (d.step_key or "").startswith("clean_documents.clean_file_group"):
            continue
        # A step's process is in flight from its launch (the parent's STEP_WORKER_STARTING)
        # to its success; the tasks here are too small for their bodies to overlap.
        if d.event_type == DagsterEventType.STEP_WORKER_STARTING:
            steps[d.step_key] = [e.timestamp, None, None]
        elif d.event_type == DagsterEventType.STEP_START:
            steps[d.step_key][2] = d.pid
        elif d.event_type == DagsterEventType.STEP_SUCCESS:
            steps[d.step_key][1] = e.timestamp
    assert len(steps) >= 4
    assert len({pid for _, _, pid in steps.values()}) >= 2
    spans = sorted((start, end) for start, end, _ in steps.values())
    assert any(b[0] < a[1] for a, b in itertools.pairwise(spans))  # two in flight at once

    reference = open_store(tmp_path / "reference")
    expected = pipeline.clean_stage(job, reference)
    from fm_pipeline.data.corpus import CleanReceipt
    from fm_pipeline.data.manifest import clean_receipt_key

    got = read_receipt(open_store(tmp_path / "store"), clean_receipt_key(mix_key(job)), CleanReceipt)
    assert got.tasks == expected.tasks >= 4 and got.sources == expected.sources
