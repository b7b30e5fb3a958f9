"""The Dagster code location (workspace.yaml loads this module).

The only module under fm_pipeline/ that touches Dagster: it merges the definitions each
area of the Dagster layer (fm_pipeline.assets.*) exports.
"""

from dagster import Definitions

from fm_pipeline.assets.data import defs as data_defs
from fm_pipeline.assets.plan import defs as plan_defs

AREAS: list[Definitions] = [data_defs, plan_defs]

defs = Definitions.merge(*AREAS) if AREAS else Definitions()
