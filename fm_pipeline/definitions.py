"""The Dagster code location (workspace.yaml loads this module).

The only module under fm_pipeline/ that touches Dagster: it merges the definitions each
area of the Dagster layer (fm_pipeline.assets.*) exports.
"""

from dagster import Definitions

# Import each area as a module: Dagster refuses a code location with more than one
# Definitions object at module scope (only `defs` may be one).
from fm_pipeline.assets import data as data_area
from fm_pipeline.assets import training as training_area

AREAS: list[Definitions] = [data_area.defs, training_area.defs]

defs = Definitions.merge(*AREAS) if AREAS else Definitions()
