"""A job submitted through the REST API and the same spec submitted the way `fm demo`
submits it reach the daemon's sensors the same way, and each segment is planned by the one
function (orchestration.segments.plan_segment, recorded as "segment_planned"): the same
plans (start, end, checkpoint), the failure resumed from the same checkpoint. Whichever
path, the process parses the job's spec once: the request (API) or the file (demo), never
the registry's stored copy again, however many sensors, runs and status calls read it."""

from __future__ import annotations

import sys
import threading
from collections import Counter

from fm_pipeline.api.auth import Principal
from fm_pipeline.api.control_plane import ControlPlane
from fm_pipeline.api.schemas import JobCreate
from fm_pipeline.cli.demo import demo_job, submit_demo
from fm_pipeline.config import dump_job, load_job
from fm_pipeline.config.load import parse_job
from fm_pipeline.config.strict_yaml import dump_yaml
from fm_pipeline.dagster_runs.orchestrator import DagsterOrchestrator
from fm_pipeline.orchestration.registry import plant_fault
from fm_pipeline.resources.training_policy import TrainingPolicyResource
from fm_pipeline.scheduling import parse_tenants
from tests import local_site
from tests.api.conftest import TENANTS
from tests.orchestration.driver import Sensors
from tests.orchestration.plans import planned_segments

# 6 steps in one segment (the API's default segment length is longer), a checkpoint every
# 2; rank 0 fails after step 3: the resume starts at the checkpoint of step 2.
PLANS = [(0, 6, None, False), (2, 6, 2, False)]


class ParsesOfJobSpecs:
    """parse_job's calls in this process (every thread), counted by the job name parsed."""

    def __init__(self):
        self.names: Counter = Counter()
        self._code = parse_job.__code__

    def _profile(self, frame, event, arg):
        if event == "call" and frame.f_code is self._code:
            data = frame.f_locals.get("data")
            self.names[data.get("name") if isinstance(data, dict) else None] += 1

    def __enter__(self):
        sys.setprofile(self._profile)
        threading.setprofile(self._profile)
        return self

    def __exit__(self, *exc):
        sys.setprofile(None)
        threading.setprofile(None)


def test_the_api_and_fm_demo_launch_the_same_plans_parsing_the_spec_once(instance, tmp_path):
    sensors = Sensors(instance, policy=TrainingPolicyResource(backoff_base_s=0))
    site, store = local_site.site(), sensors.store.open()
    with ParsesOfJobSpecs() as parses:
        # The API: POST /v1/training/jobs's control plane on the Dagster orchestrator.
        plane = ControlPlane(tenants=parse_tenants(TENANTS), store=local_site.job_store(),
                             orchestrator=DagsterOrchestrator(instance, site=site), site=site)
        body = {"model": "debug", "gpus": 1, "steps": 6, "checkpoint_every_steps": 2,
                "data_manifest": f"{site.store_uri}/data/{_mix_key(store)}/manifest.json",
                "priority": "high"}
        record = plane.submit(Principal(token_id="t", tenant="prod"), JobCreate(**body))
        api_job = plane.job_spec(record.job_id)
        plant_fault(store, api_job.name, "0:3")  # as fm demo --fail-at-step 3 plants it
        api_runs = sensors.until_idle()

        # fm demo --job FILE --fail-at-step 3, FILE holding the spec the API made.
        path = tmp_path / "same.yaml"
        path.write_text(dump_yaml({**dump_job(api_job), "name": "same"}))
        demo = demo_job(load_job(path), store)
        submit_demo(instance, store, demo, fail_at_step=3)  # the mix is published already
        demo_runs = sensors.until_idle()
        statuses = [plane.status(Principal(token_id="t", tenant="prod"), record.job_id)
                    for _ in range(3)]

    assert demo.name == "same-1" and dump_job(demo) == {**dump_job(api_job), "name": "same-1"}
    assert len(api_runs) == len(demo_runs) == 2, (api_runs, demo_runs)
    assert planned_segments(api_job.name) == planned_segments(demo.name) == PLANS
    assert statuses[-1]["status"] == "succeeded", statuses[-1]
    # Once per path: the API parsed the request, the demo its file; the registry's stored
    # copy was read back by every sensor tick, run and status call without a parse.
    assert parses.names[api_job.name] == 1 and parses.names["same"] == 1, parses.names
    assert parses.names["same-1"] == 0, parses.names


def _mix_key(store) -> str:
    (key,) = {info.key.split("/")[1] for info in store.list("data/")
              if info.key.endswith("/manifest.json")}
    return key
