"""YAML for specs that must mean one thing: duplicate keys are errors, scalars follow YAML 1.2.

    data = load_yaml(text, source="configs/demo.yaml")   # YamlError names line and key
    text = dump_yaml(data)                                # reads back the same under these rules
    value = parse_scalar("1e-3")                          # 0.001 (a --set / KEY=VALUE value)
    overrides = parse_overrides(["training.lr=1e-3"], where="--set")

PyYAML implements YAML 1.1: `1e-3` stays a string, `yes`/`no`/`on`/`off` become booleans,
`0777` is octal and `1:30` is sexagesimal; a repeated key silently keeps the last value. Here
the 1.2 core schema's scalars apply (`true`/`false` only, decimal or 0o/0x integers,
floats with or without a dot, `.inf`/`.nan`), and a repeated key is refused with both lines.
"""

from __future__ import annotations

import re
from typing import Any

import yaml
from yaml.constructor import ConstructorError
from yaml.nodes import MappingNode


class YamlError(ValueError):
    """Text that is not the YAML a spec needs; the message names where."""


class _StrictLoader(yaml.SafeLoader):
    pass


_StrictLoader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers
            if tag not in ("tag:yaml.org,2002:bool", "tag:yaml.org,2002:int",
                           "tag:yaml.org,2002:float")]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_StrictLoader.add_implicit_resolver(
    "tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"),
    list("tTfF"))
_StrictLoader.add_implicit_resolver(
    "tag:yaml.org,2002:int", re.compile(r"^(?:[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+)$"),
    list("-+0123456789"))
_StrictLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?"
               r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"),
    list("-+.0123456789"))


def _bool(loader, node):
    return loader.construct_scalar(node).lower() == "true"


def _int(loader, node):
    text = loader.construct_scalar(node)
    if text.startswith("0o"):
        return int(text[2:], 8)
    if text.startswith("0x"):
        return int(text[2:], 16)
    return int(text)


def _float(loader, node):
    text = loader.construct_scalar(node).lower()
    if text.endswith("inf"):
        return float("-inf") if text.startswith("-") else float("inf")
    if text == ".nan":
        return float("nan")
    return float(text)


def _mapping(loader, node: MappingNode, deep: bool = False):
    seen: dict[Any, Any] = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=True)
        if key in seen:
            raise ConstructorError(
                "while reading a mapping", node.start_mark,
                f"duplicate key {key!r} (first at line {seen[key].line + 1})",
                key_node.start_mark)
        seen[key] = key_node.start_mark
    return yaml.SafeLoader.construct_mapping(loader, node, deep=deep)


_StrictLoader.add_constructor("tag:yaml.org,2002:bool", _bool)
_StrictLoader.add_constructor("tag:yaml.org,2002:int", _int)
_StrictLoader.add_constructor("tag:yaml.org,2002:float", _float)
_StrictLoader.construct_mapping = _mapping


class _StrictDumper(yaml.SafeDumper):
    """Quotes every string these rules would read as something else (`1e-3`, `0o7`)."""


def _str(dumper, value: str):
    resolved = _StrictLoader.resolve(_StrictLoader, yaml.ScalarNode, value, (True, False))
    style = "'" if resolved != "tag:yaml.org,2002:str" else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_StrictDumper.add_representer(str, _str)


def dump_yaml(data: Any) -> str:
    """Keys in their given order; a string never comes back as a number or a boolean."""
    return yaml.dump(data, Dumper=_StrictDumper, sort_keys=False)


def load_yaml(text: str, *, source: str = "<yaml>") -> Any:
    try:
        return yaml.load(text, Loader=_StrictLoader)  # noqa: S506 (a SafeLoader subclass)
    except yaml.YAMLError as e:
        raise YamlError(f"{source}: {e}") from None


def parse_scalar(text: str) -> Any:
    """One KEY=VALUE value with the same scalar rules (an empty value is the empty string)."""
    if not text:
        return text
    value = load_yaml(text, source=repr(text))
    return value


def parse_overrides(pairs: list[str], *, where: str) -> dict[str, Any]:
    """`a.b=VALUE` pairs as {dotted key: value}; YamlError names a malformed pair."""
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise YamlError(f"{where} {pair!r}: expected DOTTED.KEY=VALUE")
        out[key.strip()] = parse_scalar(value)
    return out
