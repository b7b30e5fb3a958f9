"""A Dagster Pipes session as the orchestrator would open it, without Dagster: the context
as a file, messages written to a file (what PipesSubprocessClient reads)."""

from __future__ import annotations

import json
from pathlib import Path

from dagster_pipes import encode_param


def pipes_env(directory: Path, *, asset_key: str = "training_segment") -> tuple[dict, Path]:
    context = directory / "pipes_context.json"
    messages = directory / "pipes_messages.jsonl"
    context.write_text(json.dumps({
        "asset_keys": [asset_key], "code_version_by_asset_key": None,
        "provenance_by_asset_key": None, "partition_key": None, "partition_key_range": None,
        "partition_time_window": None, "run_id": "test-run", "job_name": "test",
        "retry_number": 0, "extras": {}}))
    env = {"DAGSTER_PIPES_CONTEXT": encode_param({"path": str(context)}),
           "DAGSTER_PIPES_MESSAGES": encode_param({"path": str(messages)})}
    return env, messages


def read_messages(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
