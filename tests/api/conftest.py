"""API fixtures: a published data mix, tenants, tokens, a control plane and a client."""

from __future__ import annotations

from pathlib import Path

import pytest
from fm_pipeline.scheduling import parse_tenants
from tests.api.orchestrators import RecordingOrchestrator
from tests.scheduling.trace import Clock
from tests import local_site

TENANTS = {
    "pool": {"gpu": 32},  # jobs of 1 rank run on this machine (tests/deploy)
    "tenants": [
        {"name": "research", "weight": 1, "quota": {"gpu": 8},
         "priorities": ["low", "normal"]},
        {"name": "prod", "weight": 2, "quota": {"gpu": 16},
         "priorities": ["low", "normal", "high", "urgent"]},
    ],
}

# The queue's rules on a pool that runs elsewhere (the recording orchestrator starts nothing):
# its 16-GPU llama3-8b jobs are not checked against this machine.
CLUSTER_TENANTS = {**TENANTS, "launcher": "kubernetes"}


def prepare_mix(root: Path) -> dict:
    """A real small data mix in the store under `root`: its root, key and manifest."""
    from fm_pipeline.data.testing import build_small_mix, small_job
    from fm_pipeline.storage import open_store

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FM_HOME", str(root / "home"))
        store = open_store(root / "store")
        mix = build_small_mix(small_job(), store=store)
    return mix_in(root / "store", mix.key)


def mix_in(store_root: Path, key: str) -> dict:
    return {"root": str(store_root), "key": key,
            "manifest": f"{store_root}/data/{key}/manifest.json"}


@pytest.fixture(scope="session")
def mix_store(tmp_path_factory):
    """A real small data mix, prepared once per session in its own store."""
    return prepare_mix(tmp_path_factory.mktemp("mix-store"))


@pytest.fixture
def seed_body(mix_store) -> dict:
    """The seed's body: model, gpus, parallelism {tp, pp, dp}, checkpoint cadence, data."""
    return {
        "model": "llama3-8b",
        "gpus": 16,
        "parallelism": {"tp": 4, "pp": 2, "dp": 2},
        "checkpoint_every_steps": 500,
        "data_manifest": mix_store["manifest"],
        "priority": "high",
    }


@pytest.fixture
def tokens(fm_home) -> dict[str, str]:
    store = local_site.token_store()
    return {name: store.issue(tenant=None if name == "admin" else name)[1]
            for name in ("research", "prod", "admin")}


@pytest.fixture
def plane(fm_home, mix_store):
    from fm_pipeline.api.control_plane import ControlPlane

    clock = Clock()
    clock.now = 1_800_000_000.0
    orchestrator = RecordingOrchestrator(clock)
    cp = ControlPlane(tenants=parse_tenants(CLUSTER_TENANTS), orchestrator=orchestrator,
                      store=local_site.job_store(), clock=clock, site=local_site.site().with_store(mix_store["root"]))
    yield cp
    cp.store.close()


@pytest.fixture
def client(plane, tokens):
    from fastapi.testclient import TestClient

    from fm_pipeline.api.app import create_app

    with TestClient(create_app(plane, local_site.token_store())) as c:
        yield c


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}
