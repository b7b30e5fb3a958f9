"""The job spec as a Dagster resource: every asset of a run reads the same validated JobSpec.

    resources={"job_spec": JobSpecResource(path="configs/demo.yaml")}
    run_config={"resources": {"job_spec": {"config": {"path": "my.yaml",
                                                      "overrides": ["training.steps=40"]}}}}

A relative path is looked up from the working directory, then from the repository root
(where `dagster dev -w workspace.yaml` is normally started).
"""


from pathlib import Path

from dagster import ConfigurableResource
from pydantic import Field

from fm_pipeline.config import JobSpec, load_job, parse_overrides

REPO_ROOT = Path(__file__).resolve().parents[1]


class JobSpecResource(ConfigurableResource):
    path: str = Field(default="configs/demo.yaml", description="job spec YAML")
    overrides: list[str] = Field(default_factory=list, description="dotted key=value (YAML value)")

    def resolved_path(self) -> Path:
        path = Path(self.path).expanduser()
        if not path.is_absolute() and not path.exists() and (REPO_ROOT / path).exists():
            return REPO_ROOT / path
        return path

    def load(self) -> JobSpec:
        return load_job(self.resolved_path(),
                        **parse_overrides(self.overrides, where="<overrides>"))
