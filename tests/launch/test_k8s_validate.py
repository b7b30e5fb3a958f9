"""Strict validation refuses what the API server would refuse, for CRDs and core kinds."""

from __future__ import annotations

import pytest

from fm_pipeline.launch.k8s_validate import ManifestInvalid, validate_object


def test_misspelled_field_in_a_jobset_is_refused():
    js = {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "metadata": {"name": "x"},
          "spec": {"replicatedJobs": [{"name": "w", "replicas": 1, "templat": {}}]}}
    with pytest.raises(ManifestInvalid, match="'templat' was unexpected"):
        validate_object(js)


def test_misspelled_field_in_a_core_service_is_refused():
    svc = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "x"},
           "spec": {"clusterIP": "None", "selectr": {}}}
    with pytest.raises(ManifestInvalid, match="'selectr' was unexpected"):
        validate_object(svc)


def test_a_valid_local_queue_passes():
    validate_object({"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue",
                     "metadata": {"name": "q", "namespace": "ns"},
                     "spec": {"clusterQueue": "cq"}})


def test_metadata_follows_the_api_servers_name_and_label_rules():
    svc = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "9-nodes"},
           "spec": {"clusterIP": "None"}}
    with pytest.raises(ManifestInvalid, match="metadata.name: '9-nodes' must be a DNS-1035"):
        validate_object(svc)
    js = {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
          "metadata": {"name": "demo-20", "labels": {"fm-pipeline/job": "Demo Run"}},
          "spec": {"replicatedJobs": [{"name": "node", "replicas": 1, "template": {"spec": {
              "template": {"metadata": {"annotations": {"bad key!": "x"}},
                           "spec": {"containers": []}}}}}]}}
    with pytest.raises(ManifestInvalid) as refused:
        validate_object(js)
    assert "metadata.labels.fm-pipeline/job: value 'Demo Run'" in str(refused.value)
    assert ("spec.replicatedJobs.0.template.spec.template.metadata.annotations.bad key!: key"
            in str(refused.value))


def test_the_crds_own_cel_rules_refuse_what_the_structural_schema_lets_through():
    """x-kubernetes-validations, evaluated as the API server does on a create: the JobSet
    CRD refuses an InOrder startup with dependsOn; Kueue's ResourceFlavor a toleration whose
    operator Exists has a value. Both are structurally valid."""
    js = {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "metadata": {"name": "x"},
          "spec": {"startupPolicy": {"startupPolicyOrder": "InOrder"}, "replicatedJobs": [
              {"name": "a", "replicas": 1, "template": {}},
              {"name": "b", "replicas": 1, "template": {},
               "dependsOn": [{"name": "a", "status": "Ready"}]}]}}
    with pytest.raises(ManifestInvalid, match="StartupPolicy and DependsOn APIs are mutually "
                                              "exclusive") as refused:
        validate_object(js)
    assert "spec:" in str(refused.value) and "CEL rule" in str(refused.value)
    del js["spec"]["startupPolicy"]
    validate_object(js)  # the transition rules (self == oldSelf) are for updates only
    flavor = {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor",
              "metadata": {"name": "h100"}, "spec": {"tolerations": [
                  {"key": "gpu", "operator": "Exists", "value": "yes", "effect": "NoSchedule"}]}}
    with pytest.raises(ManifestInvalid, match="spec.tolerations"):
        validate_object(flavor)
    del flavor["spec"]["tolerations"][0]["value"]
    validate_object(flavor)


def test_every_shipped_crd_rule_compiles_and_creates_skip_only_transition_rules():
    import json

    from fm_pipeline.launch.k8s_cel import _program, rule_count, schema_rules
    from fm_pipeline.launch.k8s_validate import SCHEMAS

    total = skipped = 0
    for path in sorted(SCHEMAS.glob("*_*_*.json")):
        schema = json.loads(path.read_text())
        schema = schema.get("openAPIV3Schema", schema)
        rules, transition = rule_count(schema)
        total, skipped = total + rules, skipped + transition
        for rule in schema_rules(schema):
            _program(rule)  # raises if cel-python cannot parse it
    assert total > 30 and 0 < skipped < total
