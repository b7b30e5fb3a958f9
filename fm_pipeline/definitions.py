"""The Dagster code location (workspace.yaml loads this module).

It merges the definitions each area of the Dagster layer (fm_pipeline.assets.*) exports.
Dagster is imported by the Dagster layer (assets/, resources/, fm_pipeline/dagster_runs/),
this module and the entry points that drive a deployment (cli/demo.py, cli/follow.py,
cli/data_workers.py), never by the domain core (tests/test_layers.py).
"""

from dagster import Definitions

# Import each area as a module: Dagster refuses a code location with more than one
# Definitions object at module scope (only `defs` may be one).
from fm_pipeline.assets import data as data_area
from fm_pipeline.assets import training as training_area

AREAS: list[Definitions] = [data_area.defs, training_area.defs]

defs = Definitions.merge(*AREAS) if AREAS else Definitions()
