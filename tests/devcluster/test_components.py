"""The dev cluster's components are the pinned releases, and the CRD schemas the package
ships (what `fm k8s render` validates against) are the ones the cluster installs."""

from __future__ import annotations

import json

import yaml

from fm_pipeline.launch.k8s_validate import SCHEMAS


def test_the_built_components_are_the_pinned_releases(components):
    versions = components.versions
    assert versions["k8s.io/kubernetes"] == "v1.36.3"
    assert versions["sigs.k8s.io/jobset"] == "v0.12.0"
    assert versions["sigs.k8s.io/kueue"] == "v0.19.2"
    assert versions["go.etcd.io/etcd/server/v3"].startswith("v3.6.")
    for name in ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler",
                 "jobset", "kueue"):
        assert components.binary(name).stat().st_mode & 0o111, name


def test_the_shipped_schemas_are_the_installed_crds(components):
    sources = json.loads((SCHEMAS / "sources.json").read_text())
    module_of = {"kubernetes-sigs/jobset": "jobset", "kubernetes-sigs/kueue": "kueue"}
    versions = components.versions
    checked = 0
    for source in sources:
        module = module_of.get(source["repo"])
        if module is None:
            continue  # Kubeflow's: rendered, not installed on the dev cluster
        assert source["ref"] == versions[f"sigs.k8s.io/{module}"], source["file"]
        crd_file = components.source(module) / "crd" / "bases" / source["path"].rsplit("/", 1)[1]
        crd = yaml.safe_load(crd_file.read_text())
        version = source["file"].rsplit("_", 1)[1].removesuffix(".json")
        (served,) = [v for v in crd["spec"]["versions"] if v["name"] == version]
        shipped = json.loads((SCHEMAS / source["file"]).read_text())
        assert shipped.get("openAPIV3Schema", shipped) == served["schema"]["openAPIV3Schema"], \
            source["file"]
        checked += 1
    assert checked == 13  # JobSet v1alpha2 and Kueue's six kinds in v1beta1 and v1beta2
