from __future__ import annotations

import pytest

from fm_pipeline.scheduling import FairSharePolicy, parse_tenants
from tests.scheduling.trace import Clock

LOW, NORMAL, HIGH = 100, 1000, 10000


def make_policy(pool: int, tenants: list[dict], **extra) -> tuple[FairSharePolicy, Clock]:
    clock = Clock()
    config = parse_tenants({"pool": {"gpu": pool}, "tenants": tenants, **extra})
    return FairSharePolicy(config, clock=clock), clock


@pytest.fixture
def two_tenants():
    """8 GPUs; research and prod are guaranteed 4 each."""
    return make_policy(8, [
        {"name": "research", "quota": {"gpu": 4}, "priorities": ["low", "normal", "high"]},
        {"name": "prod", "quota": {"gpu": 4}, "priorities": ["low", "normal", "high"]},
    ])
