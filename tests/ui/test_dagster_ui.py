"""What a user of `make ui` sees: the Dagster webserver on loopback, a run launched through
the GraphQL client (the data mix of a tiny job), and the asset graph rendered in headless
Chromium with that run's materializations on every node.

    FM_DOCS_SCREENSHOTS=1 pytest tests/ui    # also refresh docs/img/dagster-asset-graph.png
"""

from __future__ import annotations

import html
import os
import re
import shutil
import time

import pytest
import yaml
from dagster import DagsterRunStatus
from dagster_graphql import DagsterGraphQLClient, DagsterGraphQLClientError

from fm_pipeline.config import dump_job
from fm_pipeline.data.testing import small_job
from tests.conftest import REPO
from tests.ui.conftest import LOCATION, run_chromium

pytestmark = [pytest.mark.server, pytest.mark.slow]

DATA_ASSETS = ["clean_documents", "tokenizer", "token_shards", "data_mix"]
RUN_TIMEOUT_S = 240
DOCS_SCREENSHOT = REPO / "docs" / "img" / "dagster-asset-graph.png"


def test_graphql_launched_run_shows_on_the_rendered_asset_graph(webserver, chromium, tmp_path):
    job_file = tmp_path / "ui-mix.yaml"
    job_file.write_text(yaml.safe_dump(dump_job(small_job(name="ui-mix"))))
    client = DagsterGraphQLClient("127.0.0.1", port_number=webserver.port)
    with pytest.raises(DagsterGraphQLClientError):
        client.submit_job_execution("no_such_job", repository_location_name=LOCATION,
                                    repository_name="__repository__")
    run_id = client.submit_job_execution(
        "data_mix_job", repository_location_name=LOCATION, repository_name="__repository__",
        run_config={"execution": {"config": {"in_process": {}}},  # one process, not one per step
                    "resources": {"job_spec": {"config": {"path": str(job_file)}}}})
    assert _wait_for_run(client, run_id) == DagsterRunStatus.SUCCESS

    # Without this, a first-visit dialog covers the page.
    assert webserver.graphql("mutation { setNuxSeen }") == {"setNuxSeen": True}
    page = f"{webserver.url}/locations/__repository__@{LOCATION}/asset-groups/data/lineage"
    dom = _rendered_dom(chromium, page, tmp_path)
    text = html.unescape(re.sub(r"<[^>]+>", "\n", dom))
    visible = {line.strip() for line in text.splitlines() if line.strip()}
    assert set(DATA_ASSETS) <= visible, sorted(visible)[:80]
    assert sum(1 for line in text.splitlines() if line.strip() == "Materialized") >= 4
    for asset in DATA_ASSETS:  # each node's "latest event" links to the run we launched
        assert f"/runs/{run_id}?" in dom and f"selection={asset}&" in dom

    screenshot = tmp_path / "asset-graph.png"
    run_chromium(chromium, page, profile=tmp_path / "profile-shot",
                 action=[f"--screenshot={screenshot}"])
    assert screenshot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert screenshot.stat().st_size > 20_000  # a blank 1600x1000 page is a few kB
    if os.environ.get("FM_DOCS_SCREENSHOTS") == "1":
        shutil.copyfile(screenshot, DOCS_SCREENSHOT)


def _wait_for_run(client: DagsterGraphQLClient, run_id: str) -> DagsterRunStatus:
    done = {DagsterRunStatus.SUCCESS, DagsterRunStatus.FAILURE, DagsterRunStatus.CANCELED}
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while time.monotonic() < deadline:
        status = client.get_run_status(run_id)
        if status in done:
            return status
        time.sleep(1)
    raise AssertionError(f"run {run_id} still {status.value} after {RUN_TIMEOUT_S} s")


def _rendered_dom(chromium: str, page: str, tmp_path) -> str:
    """The DOM once the graph is drawn. The app renders asynchronously after its GraphQL
    answers, so a load under heavy CPU contention may need a second look."""
    dom = ""
    for attempt in range(3):
        out = run_chromium(chromium, page, profile=tmp_path / f"profile-dom-{attempt}",
                           action=["--dump-dom"])
        dom = out.stdout
        if all(f">{asset}<" in dom for asset in DATA_ASSETS):
            break
    return dom
