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
