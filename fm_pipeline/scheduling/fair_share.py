"""Weighted dominant-resource share (DRF), as Kueue's fair sharing defines it.

A tenant's share is its usage *above its guaranteed quota* (what it borrows), per
resource, as a fraction of the pool, taking the largest fraction (the dominant
resource), divided by the tenant's weight. Tenants within their quota have share 0;
a weight of 0 makes any borrowing infinitely expensive.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from fm_pipeline.scheduling.tenants import TenantSpec

Resources = Mapping[str, int]


def add(a: Resources, b: Resources, sign: int = 1) -> dict[str, int]:
    out = dict(a)
    for res, amount in b.items():
        out[res] = out.get(res, 0) + sign * amount
    return out


def covers(available: Resources, request: Resources) -> bool:
    return all(available.get(res, 0) >= amount for res, amount in request.items())


def borrowed(tenant: TenantSpec, usage: Resources) -> dict[str, int]:
    return {res: max(0, used - tenant.quota.get(res, 0)) for res, used in usage.items()}


def is_borrowing(tenant: TenantSpec, usage: Resources) -> bool:
    return any(amount > 0 for amount in borrowed(tenant, usage).values())


def dominant_share(tenant: TenantSpec, usage: Resources, pool: Resources) -> float:
    over = borrowed(tenant, usage)
    return max((over.get(res, 0) / cap for res, cap in pool.items()), default=0.0)


def weighted_share(tenant: TenantSpec, usage: Resources, pool: Resources) -> float:
    share = dominant_share(tenant, usage, pool)
    if tenant.weight == 0:
        return math.inf if share > 0 else 0.0
    return share / tenant.weight


def within_limit(tenant: TenantSpec, usage: Resources) -> bool:
    """Usage no more than quota + borrowing_limit, per resource (no limit: the pool caps it)."""
    if tenant.borrowing_limit is None:
        return True
    return all(
        used <= tenant.quota.get(res, 0) + tenant.borrowing_limit.get(res, 0)
        for res, used in usage.items()
        if res in tenant.borrowing_limit
    )
