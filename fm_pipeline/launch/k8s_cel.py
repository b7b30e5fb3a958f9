"""The CRDs' own CEL rules (`x-kubernetes-validations`), evaluated as the API server does.

The structural schema (k8s_validate) says which fields exist and of what type; the CEL rules
say what the controllers' authors refuse beyond that (in the JobSet CRD: a startup order
with dependsOn; in Kueue's: a toleration's operator and effect, a ClusterQueue borrowing
limit without a cohort, ...). The API server evaluates each rule on every value its schema
node matches, with `self` bound to that value, and refuses the object with the rule's
message if one is false or fails to evaluate ("Validation Rules", Kubernetes docs: CRD
validation rules). Transition rules (they read `oldSelf`) run only on an update, when there
is an old value: a create, which is all the client does, skips them, as the API server does.

cel-python (celpy) evaluates the expressions; the walk over schema and object is ours.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

_OLD_SELF = re.compile(r"\boldSelf\b")


@dataclass(frozen=True)
class CelFailure:
    path: str  # where the rule sits, dotted: spec.failurePolicy
    rule: str
    message: str

    def __str__(self) -> str:
        return f"{self.path or '(root)'}: {self.message} (CEL rule: {self.rule})"


@functools.lru_cache(maxsize=None)
def _program(rule: str):
    import celpy

    env = celpy.Environment()
    return env.program(env.compile(rule))


def _holds(rule: str, value) -> tuple[bool, str | None]:
    """(passed, why not evaluable): an evaluation error refuses the object too."""
    import celpy
    from celpy.celtypes import BoolType

    try:
        result = _program(rule).evaluate({"self": celpy.json_to_cel(value)})
    except celpy.CELParseError as e:
        return False, f"the rule does not compile: {e}"
    except Exception as e:  # celpy raises its own eval errors for missing fields, types
        return False, f"the rule could not be evaluated: {e}"
    if isinstance(result, Exception):  # celpy returns CELEvalError values
        return False, f"the rule could not be evaluated: {result}"
    if not isinstance(result, (bool, BoolType)):
        return False, f"the rule gave {result!r}, not a bool"
    return bool(result), None


def cel_failures(schema: dict, value, path: str = "") -> list[CelFailure]:
    """Every rule under `schema` that `value` breaks; creates only (no oldSelf rules)."""
    failures = []
    for rule in schema.get("x-kubernetes-validations") or []:
        expr = rule["rule"]
        if _OLD_SELF.search(expr):
            continue  # a transition rule: evaluated on updates only
        passed, error = _holds(expr, value)
        if not passed:
            message = rule.get("message") or f"failed rule: {expr}"
            where = path + (rule.get("fieldPath") or "")
            failures.append(CelFailure(where.lstrip("."), expr,
                                       f"{message}; {error}" if error else message))
    if isinstance(value, dict):
        properties = schema.get("properties") or {}
        extra = schema.get("additionalProperties")
        for key, item in value.items():
            sub = properties.get(key, extra if isinstance(extra, dict) else None)
            if sub is not None:
                failures += cel_failures(sub, item, f"{path}.{key}")
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(value):
            failures += cel_failures(schema["items"], item, f"{path}.{i}")
    return failures


def schema_nodes(node):
    """Every mapping in a nested schema, outermost first (lists walked through)."""
    stack = [node]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            yield item
            stack.extend(reversed(list(item.values())))
        elif isinstance(item, list):
            stack.extend(reversed(item))


def schema_rules(schema: dict) -> list[str]:
    """Every CEL rule a schema holds."""
    return [rule["rule"] for node in schema_nodes(schema)
            for rule in node.get("x-kubernetes-validations") or []]


def rule_count(schema: dict) -> tuple[int, int]:
    """(rules, of which transition rules) in a schema: what a create evaluates and skips."""
    rules = schema_rules(schema)
    return len(rules), sum(bool(_OLD_SELF.search(r)) for r in rules)
