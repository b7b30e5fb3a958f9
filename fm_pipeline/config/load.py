"""Read a job spec from YAML (or a dict) and turn every problem into one readable error."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from fm_pipeline.config.job import JobSpec


class JobSpecError(ValueError):
    """A job spec that cannot run. `problems` lists (field path, message) pairs."""

    def __init__(self, source: str, problems: list[tuple[str, str]]):
        self.source = source
        self.problems = problems
        lines = "\n".join(f"  - {field}: {msg}" for field, msg in problems)
        super().__init__(f"invalid job spec {source}:\n{lines}")


def _field_path(loc: tuple) -> str:
    return ".".join(str(part) for part in loc) or "(job)"


def _clean(msg: str) -> str:
    return msg.removeprefix("Value error, ")


_PREFIXED = re.compile(r"^([a-z_][a-z0-9_.]*): (.+)$")


def _split_field(base: str, line: str) -> tuple[str, str]:
    """Cross-field rules prefix their message with the field they are about."""
    m = _PREFIXED.match(line)
    if m:
        field = m.group(1) if base == "(job)" else f"{base}.{m.group(1)}"
        return field, m.group(2)
    return base, line


def parse_job(data: Any, *, source: str = "<dict>") -> JobSpec:
    if not isinstance(data, dict):
        raise JobSpecError(source, [("(job)", f"expected a mapping, got {type(data).__name__}")])
    try:
        return JobSpec.model_validate(data)
    except ValidationError as e:
        problems = []
        for err in e.errors():
            base = _field_path(err["loc"])
            for line in _clean(err["msg"]).splitlines():
                problems.append(_split_field(base, line))
        raise JobSpecError(source, problems) from None


def load_job(path: str | Path, **overrides: Any) -> JobSpec:
    """Parse `path`; `overrides` are dotted keys (`training.steps=40`) applied before validation."""
    path = Path(path)
    if not path.is_file():
        raise JobSpecError(str(path), [("(file)", "no such file")])
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as e:
        raise JobSpecError(str(path), [("(yaml)", str(e))]) from None
    except UnicodeDecodeError as e:
        raise JobSpecError(str(path), [("(file)", f"not UTF-8: {e}")]) from None
    if isinstance(data, dict):
        for key, value in overrides.items():
            set_dotted(data, key, value)
    return parse_job(data, source=str(path))


def set_dotted(data: dict, key: str, value: Any) -> None:
    node = data
    *parents, leaf = key.split(".")
    for part in parents:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise JobSpecError("<overrides>", [(key, f"{part} is not a mapping")])
    node[leaf] = value


def dump_job(job: JobSpec) -> dict:
    """A plain dict that parses back to the same spec (for manifests, MLflow, Pipes)."""
    return job.model_dump(mode="json")
