"""The object store as a Dagster resource: a local directory by default, S3 when configured.

    resources={"store": ObjectStoreResource()}                       # FM_STORE_URI or <FM_HOME>/store
    resources={"store": ObjectStoreResource(uri="s3://bucket/prefix",
                                            endpoint_url="http://127.0.0.1:9000")}

Assets call `store.open()` and hand the resulting ObjectStore to the domain core, and
`store.site()` for the rest of where state lives (the Dagster entry point of config.site).
"""

from dagster import ConfigurableResource
from pydantic import Field

from fm_pipeline.config.site import Site
from fm_pipeline.storage import ObjectStore


class ObjectStoreResource(ConfigurableResource):
    uri: str = Field(default="", description="directory or s3://bucket/prefix; empty: FM_STORE_URI or <FM_HOME>/store")
    endpoint_url: str | None = Field(default=None, description="S3 endpoint; default FM_S3_ENDPOINT_URL")

    def site(self) -> Site:
        """Built where the run executes (its FM_HOME), with this resource's store."""
        return Site.from_environ().with_store(self.uri or None, s3_endpoint=self.endpoint_url)

    def open(self) -> ObjectStore:
        return self.site().store()
