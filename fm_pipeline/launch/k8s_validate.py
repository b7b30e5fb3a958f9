"""Strict validation of rendered Kubernetes objects, as the API server would do it.

Custom resources (JobSet, Kueue, Kubeflow Trainer) are checked with jsonschema against the
CRD schemas shipped in crd_schemas/, tightened so unknown fields are
rejected like `kubectl apply --validate=strict`, and their own CEL rules
(`x-kubernetes-validations`, k8s_cel) are evaluated on the object as on a create. Core
kinds go through kubernetes-validate in strict mode. Neither checks `metadata` (a CRD
schema declares it only as an object), so names, namespaces, label and annotation keys
and label values are checked here with the API server's rules.
"""

from __future__ import annotations

import copy
import functools
import json
import re
from pathlib import Path

from fm_pipeline.launch.k8s_cel import cel_failures, schema_nodes

K8S_VERSION = "1.33"


class ManifestInvalid(ValueError):
    """A rendered object the API server would refuse; `errors` lists each problem."""

    def __init__(self, obj_ref: str, errors: list[str]):
        self.errors = errors
        super().__init__(f"{obj_ref} is invalid:\n" + "\n".join(f"  - {e}" for e in errors))


SCHEMAS = Path(__file__).resolve().parent / "crd_schemas"  # shipped: README, sources, license


def _strict(schema: dict) -> dict:
    """Add additionalProperties: false wherever an object schema lists its properties."""
    schema = copy.deepcopy(schema)
    for node in schema_nodes(schema):
        if ("properties" in node and "additionalProperties" not in node
                and not node.get("x-kubernetes-preserve-unknown-fields")):
            node["additionalProperties"] = False
    return schema


@functools.lru_cache(maxsize=None)
def _crd_schema(group: str, kind: str, version: str) -> dict:
    path = SCHEMAS / f"{group}_{kind}_{version}.json"
    if not path.is_file():
        raise FileNotFoundError(
            f"no CRD schema for {group}/{version} {kind} at {path} "
            "(the package ships them in fm_pipeline/launch/crd_schemas)"
        )
    raw = json.loads(path.read_text())
    return raw.get("openAPIV3Schema", raw)


@functools.lru_cache(maxsize=None)
def _crd_validator(group: str, kind: str, version: str):
    import jsonschema

    schema = _strict(_crd_schema(group, kind, version))
    # apiVersion/kind/metadata are the API server's, not the CRD's, to check.
    schema.setdefault("properties", {})
    for key in ("apiVersion", "kind"):
        schema["properties"].setdefault(key, {"type": "string"})
    schema["properties"]["metadata"] = {"type": "object"}
    return jsonschema.Draft7Validator(schema)


_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_QUALIFIED_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
# Kinds whose names become DNS labels (a Service name is a host name).
_DNS1035_KINDS = {"Service"}


def _is_subdomain(value: str) -> bool:
    return len(value) <= 253 and all(_DNS_LABEL.fullmatch(part) for part in value.split("."))


def label_key_errors(key: str) -> str | None:
    """Why `key` is not a valid label key (the API server's rule), or None."""
    return _key_errors(key)


def _key_errors(key: str) -> str | None:
    prefix, _, name = key.rpartition("/")
    if prefix and not _is_subdomain(prefix):
        return f"prefix {prefix!r} must be a DNS subdomain"
    if not name or len(name) > 63 or not _QUALIFIED_NAME.fullmatch(name):
        return (f"name part {name!r} must be at most 63 characters: alphanumerics, '-', '_' "
                "or '.', starting and ending with an alphanumeric")
    return None


def metadata_errors(obj: dict) -> list[str]:
    """The API server's rules for metadata.name/namespace/labels/annotations."""
    meta = obj.get("metadata")
    if not isinstance(meta, dict):
        return ["metadata: required"]
    errors = []
    name = meta.get("name")
    if not isinstance(name, str) or not name:
        errors.append("metadata.name: required")
    elif obj.get("kind") in _DNS1035_KINDS:
        if len(name) > 63 or not _DNS1035_LABEL.fullmatch(name):
            errors.append(f"metadata.name: {name!r} must be a DNS-1035 label (at most 63 "
                          "lowercase alphanumerics or '-', starting with a letter)")
    elif not _is_subdomain(name):
        errors.append(f"metadata.name: {name!r} must be a DNS subdomain (lowercase "
                      "alphanumerics, '-' and '.', at most 253 characters)")
    errors += _nested_metadata_errors(obj.get("spec"), "spec")
    namespace = meta.get("namespace")
    if namespace is not None and (len(namespace) > 63 or not _DNS_LABEL.fullmatch(namespace)):
        errors.append(f"metadata.namespace: {namespace!r} must be a DNS label")
    errors += _label_errors(meta, "metadata")
    return errors


def _nested_metadata_errors(node, path: str) -> list[str]:
    """Labels and annotations of embedded templates (a JobSet's Job and pod templates)."""
    errors = []
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "metadata" and isinstance(value, dict):
                errors += _label_errors(value, f"{path}.metadata")
            errors += _nested_metadata_errors(value, f"{path}.{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            errors += _nested_metadata_errors(value, f"{path}.{i}")
    return errors


def _label_errors(meta: dict, path: str) -> list[str]:
    errors = []
    for field in ("labels", "annotations"):
        for key, value in (meta.get(field) or {}).items():
            problem = _key_errors(key)
            if problem:
                errors.append(f"{path}.{field}.{key}: key {problem}")
            if not isinstance(value, str):
                errors.append(f"{path}.{field}.{key}: value must be a string, got {value!r}")
            elif field == "labels" and value and (
                    len(value) > 63 or not _QUALIFIED_NAME.fullmatch(value)):
                errors.append(f"{path}.labels.{key}: value {value!r} must be at most 63 "
                              "characters: alphanumerics, '-', '_' or '.', starting and "
                              "ending with an alphanumeric")
    return errors


def _ref(obj: dict) -> str:
    meta = obj.get("metadata") or {}
    return f"{obj.get('apiVersion', '?')} {obj.get('kind', '?')} {meta.get('name', '?')!r}"


def validate_object(obj: dict) -> None:
    """Raise ManifestInvalid unless the API server would accept `obj` with strict validation."""
    api_version = obj.get("apiVersion", "")
    kind = obj.get("kind", "")
    group = api_version.split("/")[0] if "/" in api_version else ""
    # Built-in API groups are named *.k8s.io (rbac.authorization.k8s.io, ...); custom
    # resources live elsewhere (jobset.x-k8s.io, kueue.x-k8s.io, kubeflow.org).
    builtin = group.endswith(".k8s.io") and not group.endswith(".x-k8s.io")
    if "." in group and not builtin:
        group, version = api_version.split("/")
        validator = _crd_validator(group, kind, version)
        errors = [
            f"{'.'.join(str(p) for p in e.absolute_path) or '(root)'}: {e.message}"
            for e in sorted(validator.iter_errors(obj), key=lambda e: list(e.absolute_path))
        ]
        if not errors:  # the API server runs the CEL rules on a structurally valid object
            errors = [str(f) for f in cel_failures(_crd_schema(group, kind, version), obj)]
    else:
        import kubernetes_validate

        try:
            kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
            errors = []
        except kubernetes_validate.ValidationError as e:
            path = ".".join(str(p) for p in e.path) or "(root)"
            errors = [f"{path}: {e.message}"]
        except kubernetes_validate.utils.SchemaNotFoundError as e:
            errors = [f"no schema for {api_version} {kind}: {e}"]
    errors = metadata_errors(obj) + quantity_errors(obj) + pod_spec_errors(obj) + errors
    if errors:
        raise ManifestInvalid(_ref(obj), errors)


# The API server's resource.Quantity: a signed decimal with a binary (Ki..Ei), decimal
# (m, k, M..E) or exponent suffix. The OpenAPI schemas type it as a bare string.
_QUANTITY = re.compile(r"^[+-]?(\d+(\.\d*)?|\.\d+)(Ki|Mi|Gi|Ti|Pi|Ei|m|k|M|G|T|P|E|[eE][+-]?\d+)?$")


def quantity_errors(node, path: str = "") -> list[str]:
    """Container resource requests and limits that are not quantities, anywhere in `node`."""
    out = []
    if isinstance(node, dict):
        for key, value in node.items():
            here = f"{path}.{key}" if path else str(key)
            if key in ("requests", "limits") and isinstance(value, dict) and path.endswith("resources"):
                out += [f"{here}.{name}: {q!r} is not a quantity (e.g. 4Gi, 500m)"
                        for name, q in value.items() if not _QUANTITY.fullmatch(str(q))]
            else:
                out += quantity_errors(value, here)
    elif isinstance(node, list):
        for i, item in enumerate(node):
            out += quantity_errors(item, f"{path}.{i}")
    return out


_RESTART_POLICIES = ("Always", "OnFailure", "Never")


def pod_spec_errors(node, path: str = "") -> list[str]:
    """What the API server's core validation refuses when a pod is made from a template
    (a JobSet's or a Job's: the CRD schema lets it through, the Job controller's pod
    create then fails): a container without an image or a name, an env var without a
    name, an unknown restartPolicy. Checked against the real apiserver in
    tests/devcluster/test_refusals.py."""
    out = []
    if isinstance(node, dict):
        if isinstance(node.get("containers"), list):
            policy = node.get("restartPolicy")
            if policy is not None and policy not in _RESTART_POLICIES:
                out.append(f"{path}.restartPolicy: unsupported value {policy!r} (one of "
                           f"{', '.join(_RESTART_POLICIES)})")
            for kind in ("initContainers", "containers"):
                for i, container in enumerate(node.get(kind) or []):
                    here = f"{path}.{kind}.{i}"
                    if not isinstance(container, dict):
                        continue
                    if not container.get("image"):
                        out.append(f"{here}.image: required (a pod's container needs one)")
                    if not container.get("name"):
                        out.append(f"{here}.name: required")
                    for j, var in enumerate(container.get("env") or []):
                        if isinstance(var, dict) and not var.get("name"):
                            out.append(f"{here}.env.{j}.name: required")
        for key, value in node.items():
            out += pod_spec_errors(value, f"{path}.{key}" if path else str(key))
    elif isinstance(node, list):
        for i, item in enumerate(node):
            out += pod_spec_errors(item, f"{path}.{i}")
    return out


def validate_all(objs: list[dict]) -> None:
    for obj in objs:
        validate_object(obj)
