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
