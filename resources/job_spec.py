"""The job spec as a Dagster resource: every asset of a run reads the same validated JobSpec.

    resources={"job_spec": JobSpecResource()}            # the embedded demo spec
    run_config={"resources": {"job_spec": {"config": {"path": "my.yaml",
                                                      "overrides": ["training.steps=40"]}}}}

A relative path is looked up from the working directory; an empty one is the spec shipped
with the package (fm_pipeline/defaults/demo.yaml).
"""


from pathlib import Path

from dagster import ConfigurableResource
from pydantic import Field

from fm_pipeline.config import JobSpec, load_job, parse_overrides
from fm_pipeline.defaults import DEMO_JOB


class JobSpecResource(ConfigurableResource):
    path: str = Field(default="", description="job spec YAML; empty: the embedded demo spec")
    registered: str = Field(default="", description=(
        "a registered training job's name: its spec from the store instead of a file"))
    overrides: list[str] = Field(default_factory=list, description="dotted key=value (YAML value)")

    def resolved_path(self) -> Path:
        return Path(self.path).expanduser() if self.path else DEMO_JOB

    def load(self) -> JobSpec:
        if self.registered:
            from fm_pipeline.config.site import Site
            from fm_pipeline.orchestration import registered_job

            return registered_job(Site.from_environ().store(), self.registered)
        return load_job(self.resolved_path(),
                        **parse_overrides(self.overrides, where="<overrides>"))
