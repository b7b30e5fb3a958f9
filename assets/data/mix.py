"""The data mix as four Dagster assets, one per pipeline stage (group "data").

    clean_documents -> tokenizer -> token_shards -> data_mix

Each asset is a thin call into `fm_pipeline.data.pipeline`; the heavy artifacts live in the
object store under `data/<mix_key>/`, the assets record metadata about them. `data_mix`
outputs a `MixRef` (store URI + mix key) that downstream assets take as an input:

    @asset
    def training_plan(data_mix: MixRef): mix = data_mix.open()
"""


from dagster import AssetExecutionContext, MaterializeResult, MetadataValue, Output, asset
from fm_pipeline.assets.data.clean import GROUP, clean_documents
from fm_pipeline.assets.data.markdown import markdown_table
from fm_pipeline.assets.data.shards import token_shards
from fm_pipeline.assets.data.steps import LogProgress
from fm_pipeline.resources.job_spec import JobSpecResource
from fm_pipeline.resources.store import ObjectStoreResource

from fm_pipeline.data import pipeline
from fm_pipeline.data.manifest import mix_key
from fm_pipeline.data.mix import MixRef


@asset(group_name=GROUP, deps=[clean_documents], kinds={"python"})
def tokenizer(context: AssetExecutionContext, job_spec: JobSpecResource,
              store: ObjectStoreResource) -> MaterializeResult:
    """Byte-level BPE trained on the clean corpus; saved as data/<mix_key>/tokenizer.json."""
    job = job_spec.load()
    target = store.open()
    entry = pipeline.tokenizer_stage(job, target, progress=LogProgress(context))
    return MaterializeResult(metadata={
        "mix_key": mix_key(job), "vocab_size": entry.vocab_size, "eos_id": entry.eos_id,
        "sha256": entry.sha256, "uri": MetadataValue.path(target.uri_of(entry.key)),
    })


@asset(group_name=GROUP, deps=[token_shards], kinds={"python"})
def data_mix(context: AssetExecutionContext, job_spec: JobSpecResource,
             store: ObjectStoreResource) -> Output[MixRef]:
    """The published mix: manifest (written last) + the pre-shuffled global sample index."""
    job = job_spec.load()
    target = store.open()
    manifest = pipeline.publish_stage(job, target, progress=LogProgress(context))
    ref = MixRef(store_uri=target.uri, key=manifest.key, endpoint_url=store.endpoint_url)
    return Output(ref, metadata={
        "mix_key": manifest.key, "manifest": MetadataValue.path(target.uri_of(f"data/{manifest.key}/manifest.json")),
        "samples": manifest.sample_index.samples, "seq_len": manifest.seq_len,
        "train_tokens": manifest.train_tokens,
        "sources": MetadataValue.md(markdown_table(
            ["source", "weight", "train tokens", "held-out tokens", "shards", "samples", "epochs"],
            [[s.name, s.weight, s.train_tokens, s.heldout_tokens, len(s.shards), s.samples, s.epochs]
             for s in manifest.sources])),
    })
