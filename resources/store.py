"""The object store as a Dagster resource: a local directory by default, S3 when configured.

    resources={"store": ObjectStoreResource()}                       # FM_STORE_URI or <FM_HOME>/store
    resources={"store": ObjectStoreResource(uri="s3://bucket/prefix",
                                            endpoint_url="http://127.0.0.1:9000")}

Assets call `store.open()` and hand the resulting ObjectStore to the domain core.
"""


from dagster import ConfigurableResource
from pydantic import Field

from fm_pipeline.config.paths import store_uri
from fm_pipeline.storage import ObjectStore, open_store


class ObjectStoreResource(ConfigurableResource):
    uri: str = Field(default="", description="directory or s3://bucket/prefix; empty: FM_STORE_URI or <FM_HOME>/store")
    endpoint_url: str | None = Field(default=None, description="S3 endpoint; default FM_S3_ENDPOINT_URL")

    def open(self) -> ObjectStore:
        return open_store(self.uri or store_uri(), endpoint_url=self.endpoint_url)
