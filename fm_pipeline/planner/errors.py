"""The one error type the planner raises for bad input.

Each error names the input it is about with the planner's field name, which is also the
`fm plan` flag without its dashes (`kv_heads` <-> `--kv-heads`), so the command line can
tell the user exactly which flag to fix.
"""

from __future__ import annotations


class PlanInputError(ValueError):
    """A model, cluster or layout the planner cannot evaluate. `field` names the input."""

    def __init__(self, field: str, message: str):
        self.field = field
        self.detail = message
        super().__init__(f"{field}: {message}")

    @property
    def flag(self) -> str:
        return "--" + self.field.replace("_", "-")


def require_positive(field: str, value: float, *, integer: bool = False) -> None:
    if integer and (not isinstance(value, int) or isinstance(value, bool)):
        raise PlanInputError(field, f"must be a whole number, got {value!r}")
    if not value > 0:
        raise PlanInputError(field, f"must be > 0, got {value!r}")
