"""What a user of `make ui` sees: the Dagster webserver on loopback, a run launched through
the GraphQL client (the data mix of a tiny job), and the asset graph rendered in headless
Chromium with that run's materializations on every node.

    FM_DOCS_SCREENSHOTS=1 pytest tests/ui    # also refresh docs/img/dagster-asset-graph.png
"""

from __future__ import annotations

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
from tests.ui.browser import HeadlessChromium
from tests.ui.conftest import LOCATION

pytestmark = [pytest.mark.server, pytest.mark.slow]

DATA_ASSETS = ["clean_documents", "tokenizer", "token_shards", "data_mix"]
RUN_TIMEOUT_S = 240
PAGE_TIMEOUT_S = 90
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
        run_config={"resources": {"job_spec": {"config": {"path": str(job_file)}}}})
    assert _wait_for_run(client, run_id) == DagsterRunStatus.SUCCESS

    # Without this, a first-visit dialog covers the page.
    assert webserver.graphql("mutation { setNuxSeen }") == {"setNuxSeen": True}
    page = f"{webserver.url}/locations/__repository__@{LOCATION}/asset-groups/data/lineage"
    with HeadlessChromium(chromium, profile=tmp_path / "chromium-profile") as browser:
        browser.open(page)
        # Visible text, as a user reads it: every asset's name and its "Materialized" row.
        browser.wait_for_text(_graph_drawn, timeout_s=PAGE_TIMEOUT_S)
        dom = browser.dom()
        screenshot = browser.screenshot(tmp_path / "asset-graph.png")
    for asset in DATA_ASSETS:  # each node's "latest event" links to the run we launched
        # (clean_documents is a graph of ops: its link selects one of them)
        assert re.search(rf'href="/runs/{run_id}\?[^"]*selection={asset}(\.\w+)?&', dom), asset
    assert screenshot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert screenshot.stat().st_size > 20_000  # a blank 1600x1000 page is a few kB
    if os.environ.get("FM_DOCS_SCREENSHOTS") == "1":
        shutil.copyfile(screenshot, DOCS_SCREENSHOT)


def _graph_drawn(text: str) -> bool:
    lines = [line.strip() for line in text.splitlines()]
    return set(DATA_ASSETS) <= set(lines) and lines.count("Materialized") >= len(DATA_ASSETS)


def _wait_for_run(client: DagsterGraphQLClient, run_id: str) -> DagsterRunStatus:
    done = {DagsterRunStatus.SUCCESS, DagsterRunStatus.FAILURE, DagsterRunStatus.CANCELED}
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while time.monotonic() < deadline:
        status = client.get_run_status(run_id)
        if status in done:
            return status
        time.sleep(1)
    raise AssertionError(f"run {run_id} still {status.value} after {RUN_TIMEOUT_S} s")

