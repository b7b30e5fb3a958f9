"""The tenants config renders Kueue v1beta2 objects that strict validation accepts."""

from __future__ import annotations

import copy

import pytest

from fm_pipeline.launch.k8s_validate import ManifestInvalid, validate_object
from fm_pipeline.scheduling import load_tenants, parse_tenants
from fm_pipeline.scheduling.kueue import render_kueue

KINDS = ["Namespace", "Topology", "ResourceFlavor", "WorkloadPriorityClass", "Cohort",
         "ClusterQueue", "LocalQueue"]


@pytest.fixture(scope="module")
def objects() -> list[dict]:
    return render_kueue(load_tenants())


def _one(objects, kind, name=None):
    return next(o for o in objects if o["kind"] == kind and name in (None, o["metadata"]["name"]))


@pytest.mark.parametrize("kind", KINDS)
def test_each_kind_validates_strictly(objects, kind):
    rendered = [o for o in objects if o["kind"] == kind]
    assert rendered
    for obj in rendered:
        validate_object(obj)
        if kind != "Namespace":
            assert obj["apiVersion"] == "kueue.x-k8s.io/v1beta2"


def test_queues_carry_the_tenants_quota_weight_and_preemption(objects):
    config = load_tenants()
    shared = _one(objects, "Cohort")["spec"]["resourceGroups"][0]["flavors"][0]["resources"]
    assert shared == [{"name": "nvidia.com/gpu", "nominalQuota": 2}]  # 8 - (2 + 4 + 0)
    for tenant in config.tenants:
        cq = _one(objects, "ClusterQueue", tenant.name)["spec"]
        res = cq["resourceGroups"][0]["flavors"][0]["resources"][0]
        assert res["nominalQuota"] == tenant.quota.get("gpu", 0)
        assert cq["fairSharing"]["weight"] == tenant.weight
        assert cq["cohortName"] == "fm-pipeline" and cq["queueingStrategy"] == "StrictFIFO"
        assert cq["preemption"]["reclaimWithinCohort"] == "Any"
        lq = _one(objects, "LocalQueue", tenant.name)
        assert lq["metadata"]["namespace"] == tenant.k8s_namespace
        assert lq["spec"]["clusterQueue"] == tenant.name
    assert _one(objects, "ClusterQueue", "eval")["spec"]["resourceGroups"][0]["flavors"][0][
        "resources"][0]["borrowingLimit"] == 4
    values = {o["metadata"]["name"]: o["value"] for o in objects if o["kind"] == "WorkloadPriorityClass"}
    assert values == {"fm-low": 100, "fm-normal": 1000, "fm-high": 10000, "fm-urgent": 100000}


@pytest.mark.parametrize(
    "kind, breaks, field",
    [
        ("ClusterQueue", lambda o: o["spec"]["fairSharing"].update(wieght=2), "spec.fairSharing"),
        ("ClusterQueue", lambda o: o["spec"].update(queueingStrategy="Random"), "spec.queueingStrategy"),
        ("Cohort", lambda o: o["spec"].update(parent="x"), "spec"),
        ("LocalQueue", lambda o: o["spec"].update(clusterQueue=7), "spec.clusterQueue"),
        ("Topology", lambda o: o["spec"]["levels"][0].update(label="x"), "spec.levels.0"),
        ("ResourceFlavor", lambda o: o["spec"].update(nodeTaints=[{"key": "k"}]), "spec.nodeTaints.0"),
        ("WorkloadPriorityClass", lambda o: o.update(value="high"), "value"),
    ],
)
def test_a_broken_object_is_rejected_naming_the_field(objects, kind, breaks, field):
    broken = copy.deepcopy(_one(objects, kind))
    breaks(broken)
    with pytest.raises(ManifestInvalid) as err:
        validate_object(broken)
    assert any(e.startswith(f"{field}:") for e in err.value.errors), err.value.errors


def test_rules_kueue_checks_with_cel_are_enforced_before_rendering():
    base = load_tenants().model_dump()
    bad = copy.deepcopy(base)
    bad["kueue"]["topology_levels"] = ["kubernetes.io/hostname", "cloud.provider.com/topology-rack"]
    with pytest.raises(ValueError, match="kueue.topology_levels: kubernetes.io/hostname"):
        render_kueue(parse_tenants(bad))
    bad = copy.deepcopy(base)
    bad["kueue"]["node_labels"] = {}
    with pytest.raises(ValueError, match="kueue.node_labels"):
        render_kueue(parse_tenants(bad))
