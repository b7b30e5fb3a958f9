"""Read a job spec from YAML (or a dict) and turn every problem into one readable error."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from fm_pipeline.config import strict_yaml
from fm_pipeline.config.spec import JobSpec


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


_KINDS = {bool: "a boolean", str: "a string", int: "an integer", float: "a number",
          list: "a list", dict: "a mapping", type(None): "null"}


def _got(err: dict) -> str:
    """What the value was, by kind only (never echoed: it may be anything)."""
    if err["type"] in ("missing", "extra_forbidden") or "input" not in err:
        return ""
    kind = _KINDS.get(type(err["input"]), type(err["input"]).__name__)
    if err["type"] == "finite_number":
        return f" (got {err['input']!r})"
    if err["type"].endswith(("_type", "_parsing")) or err["type"] == "literal_error":
        return f" (got {kind})"
    return ""


def validation_problems(error: ValidationError, *, base: tuple = ()) -> list[tuple[str, str]]:
    """(field path, message) for every error, each with its own reason; cross-field rules
    that prefix their message with a field keep that field."""
    problems = []
    for err in error.errors(include_url=False):
        path = _field_path((*base, *err["loc"]))
        lines = _clean(err["msg"]).splitlines() or [err["type"]]
        for i, line in enumerate(lines):
            problems.append(_split_field(path, line + (_got(err) if i == 0 else "")))
    return problems


def parse_job(data: Any, *, source: str = "<dict>") -> JobSpec:
    """Strict: integers are integers and booleans booleans (no coercion from strings or
    between the two), numbers are finite, unknown fields are refused."""
    if not isinstance(data, dict):
        raise JobSpecError(source, [("(job)", f"expected a mapping, got {type(data).__name__}")])
    try:
        return JobSpec.model_validate(data)
    except ValidationError as e:
        raise JobSpecError(source, validation_problems(e)) from None


def parse_overrides(pairs: list[str], *, where: str = "--set") -> dict[str, Any]:
    """`--set a.b=VALUE` pairs (VALUE read as a YAML 1.2 scalar) as {dotted key: value}."""
    try:
        return strict_yaml.parse_overrides(pairs, where=where)
    except strict_yaml.YamlError as e:
        raise JobSpecError(where, [("(override)", str(e))]) from None


def load_job(path: str | Path, **overrides: Any) -> JobSpec:
    """Parse `path`; `overrides` are dotted keys (`training.steps=40`) applied before validation."""
    path = Path(path)
    if not path.is_file():
        raise JobSpecError(str(path), [("(file)", "no such file")])
    try:
        data = strict_yaml.load_yaml(path.read_text(encoding="utf-8"), source=str(path))
    except strict_yaml.YamlError as e:
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
