"""A tenant removed from the tenants file while it has jobs: the control plane still starts
for everyone else, reports those jobs with the command that clears them, and counts the GPUs
their running jobs still hold until they end."""

from __future__ import annotations

from typer.testing import CliRunner

from fm_pipeline.api.auth import Principal
from fm_pipeline.api.control_plane import ControlPlane, stranded_report
from fm_pipeline.api.schemas import JobCreate
from fm_pipeline.scheduling import parse_tenants
from tests.api.conftest import CLUSTER_TENANTS
from tests import local_site

WITH_GHOST = {**CLUSTER_TENANTS, "tenants": [*CLUSTER_TENANTS["tenants"], {
    "name": "ghost", "weight": 1, "quota": {"gpu": 8}, "priorities": ["normal"]}]}


def body(seed_body, gpus: int) -> JobCreate:
    return JobCreate.model_validate({**seed_body, "gpus": gpus, "priority": "normal",
                                     "parallelism": {"tp": 4, "pp": 2, "dp": gpus // 8}})


def test_a_removed_tenant_stops_no_one_and_its_jobs_are_reported(plane, seed_body, mix_store):
    orch = plane.orchestrator
    ghost_plane = ControlPlane(tenants=parse_tenants(WITH_GHOST), orchestrator=orch,
                               store=local_site.job_store(), clock=plane.clock, site=local_site.site().with_store(mix_store["root"]))
    ghost = Principal(tenant="ghost", token_id="g")
    running = ghost_plane.submit(ghost, body(seed_body, 8)).job_id
    waiting = ghost_plane.submit(ghost, body(seed_body, 32)).job_id  # more than is free
    assert [ghost_plane.store.get(j).queue_state for j in (running, waiting)] == [
        "admitted", "queued"]
    ghost_plane.store.close()

    # The file without ghost: `fm api serve` used to exit with "unknown tenant 'ghost'".
    served = ControlPlane(tenants=parse_tenants(CLUSTER_TENANTS), orchestrator=orch,
                          store=local_site.job_store(), clock=plane.clock, site=local_site.site().with_store(mix_store["root"]))
    assert set(served.stranded) == {running, waiting}
    report = stranded_report(served.store, served.stranded)
    assert running in report and waiting in report and "unknown tenant 'ghost'" in report
    assert "its 8 GPUs counted against the pool" in report
    assert "fm api queue drain --tenant ghost" in report

    # The others are served, and ghost's running job still holds 8 of the 32 GPUs.
    prod = Principal(tenant="prod", token_id="p")
    whole = served.submit(prod, body(seed_body, 32)).job_id
    assert served.store.get(whole).queue_state == "queued"
    served.cancel(prod, whole)
    part = served.submit(prod, body(seed_body, 24)).job_id
    assert served.store.get(part).queue_state == "admitted"

    # When ghost's run ends its GPUs are free again.
    orch.end(running, "succeeded")
    served.reconcile()
    assert served.store.get(running).queue_state == "done"
    research = Principal(tenant="research", token_id="r")
    small = served.submit(research, body(seed_body, 8)).job_id
    assert served.store.get(small).queue_state == "admitted"

    # The command the report names cancels what ghost still has queued.
    from fm_pipeline.cli.main import app

    out = CliRunner().invoke(app, ["api", "queue", "drain", "--tenant", "ghost"])
    assert out.exit_code == 0, out.output
    assert waiting in out.output
    assert served.store.get(waiting).queue_state == "done"
    assert served.store.get(waiting).cancelled_at is not None
    listed = CliRunner().invoke(app, ["api", "queue", "list"])
    assert waiting not in listed.output and part in listed.output
    served.store.close()
