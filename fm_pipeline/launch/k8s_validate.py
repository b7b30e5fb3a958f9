"""Strict validation of rendered Kubernetes objects, as the API server would do it.

Custom resources (JobSet, Kueue, Kubeflow Trainer) are checked with jsonschema against the
CRD schemas in ../shared/k8s-schemas (or $FM_K8S_SCHEMAS), tightened so unknown fields are
rejected like `kubectl apply --validate=strict`. Core kinds go through kubernetes-validate
in strict mode.
"""

from __future__ import annotations

import copy
import functools
import json
import os
from pathlib import Path

K8S_VERSION = "1.33"


class ManifestInvalid(ValueError):
    """A rendered object the API server would refuse; `errors` lists each problem."""

    def __init__(self, obj_ref: str, errors: list[str]):
        self.errors = errors
        super().__init__(f"{obj_ref} is invalid:\n" + "\n".join(f"  - {e}" for e in errors))


def schemas_dir() -> Path:
    env = os.environ.get("FM_K8S_SCHEMAS")
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[2].parent / "shared" / "k8s-schemas"


def _strict(schema: dict) -> dict:
    """Add additionalProperties: false wherever an object schema lists its properties."""
    schema = copy.deepcopy(schema)

    def visit(node):
        if isinstance(node, dict):
            if (
                "properties" in node
                and "additionalProperties" not in node
                and not node.get("x-kubernetes-preserve-unknown-fields")
            ):
                node["additionalProperties"] = False
            for value in node.values():
                visit(value)
        elif isinstance(node, list):
            for value in node:
                visit(value)

    visit(schema)
    return schema


@functools.lru_cache(maxsize=None)
def _crd_validator(group: str, kind: str, version: str):
    import jsonschema

    path = schemas_dir() / f"{group}_{kind}_{version}.json"
    if not path.is_file():
        raise FileNotFoundError(
            f"no CRD schema for {group}/{version} {kind} at {path} "
            "(set FM_K8S_SCHEMAS to the k8s-schemas directory)"
        )
    raw = json.loads(path.read_text())
    schema = raw.get("openAPIV3Schema", raw)
    schema = _strict(schema)
    # apiVersion/kind/metadata are the API server's, not the CRD's, to check.
    schema.setdefault("properties", {})
    for key in ("apiVersion", "kind"):
        schema["properties"].setdefault(key, {"type": "string"})
    schema["properties"]["metadata"] = {"type": "object"}
    return jsonschema.Draft7Validator(schema)


def _ref(obj: dict) -> str:
    meta = obj.get("metadata") or {}
    return f"{obj.get('apiVersion', '?')} {obj.get('kind', '?')} {meta.get('name', '?')!r}"


def validate_object(obj: dict) -> None:
    """Raise ManifestInvalid unless the API server would accept `obj` with strict validation."""
    api_version = obj.get("apiVersion", "")
    kind = obj.get("kind", "")
    if "/" in api_version and "." in api_version.split("/")[0]:
        group, version = api_version.split("/")
        validator = _crd_validator(group, kind, version)
        errors = [
            f"{'.'.join(str(p) for p in e.absolute_path) or '(root)'}: {e.message}"
            for e in sorted(validator.iter_errors(obj), key=lambda e: list(e.absolute_path))
        ]
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
    if errors:
        raise ManifestInvalid(_ref(obj), errors)


def validate_all(objs: list[dict]) -> None:
    for obj in objs:
        validate_object(obj)
