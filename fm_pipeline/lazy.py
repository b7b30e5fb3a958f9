"""Package exports that import their module on first use: a torchrun worker or a control-side
process that needs one name of a package does not pay for (or need) the rest.

    _EXPORTS = {"CheckpointManager": "manager", "restore": "load"}     # name -> submodule
    __getattr__ = lazy_exports(__name__, _EXPORTS)
    __all__ = sorted(_EXPORTS)
"""

from __future__ import annotations

import importlib
from collections.abc import Callable


def lazy_exports(package: str, exports: dict[str, str]) -> Callable[[str], object]:
    """A module-level __getattr__ for `package` resolving `exports` (name -> submodule,
    relative to the package, or an absolute module path)."""

    def __getattr__(name: str):
        if name not in exports:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        where = exports[name]
        module = where if where.startswith("fm_pipeline.") else f"{package}.{where}"
        return getattr(importlib.import_module(module), name)

    return __getattr__
