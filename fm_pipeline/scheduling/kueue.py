"""Render the tenants config as Kueue objects (kueue.x-k8s.io/v1beta2), strictly validated.

    fm api kueue render --tenants configs/tenants.yaml --out .fm/kueue
    kubectl apply -f .fm/kueue/

One cohort holds the pool: each tenant's ClusterQueue is guaranteed its `quota`
(nominalQuota) and may borrow up to `borrowing_limit`; the Cohort's own nominalQuota is
the shared pool (capacity minus all quotas). Fair-sharing weights, StrictFIFO queues and
the preemption block mirror `FairSharePolicy`. What Kueue cannot express: the per-job
preemption bound per hour and the per-tenant allowed priority classes (the API enforces
both). Jobs carry `kueue.x-k8s.io/queue-name: <local_queue_name(tenant)>` and
`kueue.x-k8s.io/priority-class: <priority_class_name(priority)>`.
"""

from __future__ import annotations

from fm_pipeline.launch.jobset import priority_class_name
from fm_pipeline.launch.k8s_validate import validate_all
from fm_pipeline.scheduling.tenants import TenantsConfig, TenantSpec, priority_values

__all__ = ["job_labels", "local_queue_name", "priority_class_name", "render_kueue"]

API_VERSION = "kueue.x-k8s.io/v1beta2"
MANAGED_BY = {"app.kubernetes.io/managed-by": "fm-pipeline"}
HOSTNAME_LABEL = "kubernetes.io/hostname"


def local_queue_name(tenant: str) -> str:
    """The LocalQueue (in the tenant's namespace) a tenant's jobs name in their queue-name label."""
    return tenant


def job_labels(tenant: TenantSpec, priority: str) -> dict[str, str]:
    return {
        "kueue.x-k8s.io/queue-name": local_queue_name(tenant.name),
        "kueue.x-k8s.io/priority-class": priority_class_name(priority),
    }


def render_kueue(config: TenantsConfig) -> list[dict]:
    """Every object, in apply order; raises ManifestInvalid (naming the field) if any is invalid."""
    _check_rules(config)
    objs: list[dict] = []
    namespaces = sorted({t.k8s_namespace for t in config.tenants} - {"default"})
    objs += [_namespace(ns) for ns in namespaces]
    if config.kueue.topology:
        objs.append(_topology(config))
    objs.append(_resource_flavor(config))
    objs += [
        _priority_class(name, value) for name, value in sorted(
            priority_values().items(), key=lambda kv: kv[1]
        )
    ]
    objs.append(_cohort(config))
    objs += [_cluster_queue(config, t) for t in config.tenants]
    objs += [_local_queue(t) for t in config.tenants]
    validate_all(objs)
    return objs


def _meta(name: str, namespace: str | None = None) -> dict:
    meta = {"name": name, "labels": dict(MANAGED_BY)}
    if namespace:
        meta["namespace"] = namespace
    return meta


def _namespace(name: str) -> dict:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": _meta(name)}


def _topology(config: TenantsConfig) -> dict:
    return {
        "apiVersion": API_VERSION, "kind": "Topology", "metadata": _meta(config.kueue.topology),
        "spec": {"levels": [{"nodeLabel": label} for label in config.kueue.topology_levels]},
    }


def _resource_flavor(config: TenantsConfig) -> dict:
    spec: dict = {}
    if config.kueue.node_labels:
        spec["nodeLabels"] = dict(config.kueue.node_labels)
    if config.kueue.topology:
        spec["topologyName"] = config.kueue.topology
    return {
        "apiVersion": API_VERSION, "kind": "ResourceFlavor",
        "metadata": _meta(config.kueue.flavor), "spec": spec,
    }


def _priority_class(priority: str, value: int) -> dict:
    return {
        "apiVersion": API_VERSION, "kind": "WorkloadPriorityClass",
        "metadata": _meta(priority_class_name(priority)), "value": value,
        "description": f"fm-pipeline job priority {priority!r}",
    }


def _quantity(resource: str, amount: int) -> int | str:
    return f"{amount}Gi" if resource == "memory_gib" else amount


def _resource_group(config: TenantsConfig, quota: dict, borrowing_limit: dict | None) -> dict:
    names = config.kueue.resource_names
    resources = []
    for res in config.pool:  # same order as coveredResources (Kueue's webhook requires it)
        entry = {"name": names[res], "nominalQuota": _quantity(res, quota.get(res, 0))}
        if borrowing_limit is not None and res in borrowing_limit:
            entry["borrowingLimit"] = _quantity(res, borrowing_limit[res])
        resources.append(entry)
    return {
        "coveredResources": [names[res] for res in config.pool],
        "flavors": [{"name": config.kueue.flavor, "resources": resources}],
    }


def _weight(weight: float) -> int | str:
    return int(weight) if float(weight).is_integer() else f"{weight:g}"


def _cohort(config: TenantsConfig) -> dict:
    return {
        "apiVersion": API_VERSION, "kind": "Cohort", "metadata": _meta(config.kueue.cohort),
        "spec": {"resourceGroups": [_resource_group(config, config.shared_pool(), None)]},
    }


def _cluster_queue(config: TenantsConfig, tenant: TenantSpec) -> dict:
    return {
        "apiVersion": API_VERSION, "kind": "ClusterQueue", "metadata": _meta(tenant.name),
        "spec": {
            "cohortName": config.kueue.cohort,
            "namespaceSelector": {
                "matchLabels": {"kubernetes.io/metadata.name": tenant.k8s_namespace}
            },
            "queueingStrategy": "StrictFIFO",
            "resourceGroups": [_resource_group(config, tenant.quota, tenant.borrowing_limit)],
            "fairSharing": {"weight": _weight(tenant.weight)},
            "preemption": {
                "reclaimWithinCohort": "Any",
                "borrowWithinCohort": {"policy": "LowerPriority"},
                "withinClusterQueue": "LowerPriority",
            },
        },
    }


def _local_queue(tenant: TenantSpec) -> dict:
    return {
        "apiVersion": API_VERSION, "kind": "LocalQueue",
        "metadata": _meta(local_queue_name(tenant.name), tenant.k8s_namespace),
        "spec": {"clusterQueue": tenant.name},
    }


def _check_rules(config: TenantsConfig) -> None:
    """Kueue's CEL rules that a JSON schema cannot express, for the objects we render."""
    k = config.kueue
    missing = [res for res in config.pool if res not in k.resource_names]
    if missing:
        raise ValueError(f"kueue.resource_names: no Kubernetes resource name for {missing}")
    if k.topology:
        levels = k.topology_levels
        if not levels:
            raise ValueError("kueue.topology_levels: a topology needs at least one level")
        if len(set(levels)) != len(levels):
            raise ValueError(f"kueue.topology_levels: must be unique, got {levels}")
        if HOSTNAME_LABEL in levels and levels[-1] != HOSTNAME_LABEL:
            raise ValueError(f"kueue.topology_levels: {HOSTNAME_LABEL} can only be the lowest level")
        if not k.node_labels:
            raise ValueError("kueue.node_labels: a flavor with a topology needs at least one node label")
