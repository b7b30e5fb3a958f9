"""Blocking data-quality checks on the data assets (Great Expectations, run by the core).

A failing ERROR check fails its step and Dagster skips every asset downstream: bad shards
never reach `data_mix`, and a bad mix never reaches training. `dedup_ratio` only warns.
"""


from collections.abc import Callable, Iterator

from dagster import AssetCheckResult, AssetCheckSeverity, AssetCheckSpec, multi_asset_check
from fm_pipeline.assets.data.mix import clean_documents, data_mix, token_shards, tokenizer
from fm_pipeline.resources.job_spec import JobSpecResource
from fm_pipeline.resources.store import ObjectStoreResource

from fm_pipeline.data import validate


def _results(asset, outcomes) -> Iterator[AssetCheckResult]:
    for o in outcomes:
        yield AssetCheckResult(
            asset_key=asset.key, check_name=o.name, passed=o.passed, description=o.description,
            severity=AssetCheckSeverity.WARN if o.severity == "warn" else AssetCheckSeverity.ERROR,
            metadata={k: v if isinstance(v, (int, float, str, bool)) else str(v) for k, v in o.metadata.items()},
        )


def _checks(asset, names: list[str], run: Callable, *, description: str, blocking: bool = True):
    @multi_asset_check(
        name=f"{asset.key.to_user_string()}_checks",
        specs=[AssetCheckSpec(n, asset=asset, blocking=blocking) for n in names],
        description=description,
    )
    def _check(job_spec: JobSpecResource, store: ObjectStoreResource):
        yield from _results(asset, run(job_spec.load(), store.open()))

    return _check


clean_documents_checks = _checks(
    clean_documents, ["dedup_ratio", "filter_drop_rates"], validate.clean_checks,
    blocking=False,
    description="Reports exact- and near-duplicate ratios and quality-filter drop rates per "
                "source (warns above 0.5 duplicates or 0.9 filtered).",
)
tokenizer_checks = _checks(
    tokenizer, ["tokenizer_fits_model_vocab"], validate.tokenizer_checks,
    description="The tokenizer's ids fit the model's vocabulary.",
)
token_shards_checks = _checks(
    token_shards, ["token_ids_below_vocab", "no_empty_shards", "shards_within_token_limit"],
    validate.shard_checks,
    description="Every token id < vocab_size; no shard is empty or above the token limit; every "
                "source has shards.",
)
data_mix_checks = _checks(
    data_mix, ["weights_sum_to_one", "source_counts_match_manifest"], validate.mix_checks,
    description="Weights sum to 1 and are honoured; counts and checksums re-measured equal the manifest.",
)

DATA_CHECKS = [clean_documents_checks, tokenizer_checks, token_shards_checks, data_mix_checks]
