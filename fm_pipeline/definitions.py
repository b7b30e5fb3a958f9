"""The Dagster code location (workspace.yaml loads this module).

The only module under fm_pipeline/ that touches Dagster: it merges the definitions each
area of the Dagster layer (fm_pipeline.assets.*) exports.
"""

from dagster import Definitions

AREAS: list[Definitions] = []

defs = Definitions.merge(*AREAS) if AREAS else Definitions()
