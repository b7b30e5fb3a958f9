"""Gopher and C4 quality filters, each by its name with a document it must drop and one it
must keep; PII masking; code sources never filtered; the mix key unchanged when off."""

from __future__ import annotations

import pytest

from fm_pipeline.config.spec import QualitySpec
from fm_pipeline.data.clean import DocumentFilter
from fm_pipeline.data.quality import mask_pii, quality_problem
from fm_pipeline.data.sources import RawDocument
from fm_pipeline.data.testing import small_job

PROSE = (
    "The committee met on Tuesday to review the plan. It was agreed that the budget would be "
    "raised, and that the work of the new team would start in spring. Members asked to have "
    "the figures checked with the auditors before the vote. The chair said the decision "
    "should be made with care, and the minutes of the meeting were approved by all present. "
    "A second session will be held next month to settle the remaining points of the agenda."
)
SPEC = QualitySpec()


def test_good_prose_passes_every_filter():
    assert quality_problem(PROSE, SPEC) is None


@pytest.mark.parametrize("text, reason", [
    ("the and of " * 5, "gopher_word_count"),
    (" ".join(["supercalifragilisticexpialidocious"] * 60) + " the and",
     "gopher_mean_word_length"),
    (PROSE + " #tag" * 20, "gopher_symbol_ratio"),
    ("\n".join(f"- reviewing the quarterly figures and budgets with colleagues {i}"
               for i in range(60)), "gopher_bullet_lines"),
    ("\n".join(f"and then the story of the long winding road {i} went on and on..."
               for i in range(60)), "gopher_ellipsis_lines"),
    (PROSE + " " + " ".join(["1234 5678 90"] * 40), "gopher_alphabetic_words"),
    (" ".join(f"word{i} alpha beta gamma" for i in range(30)), "gopher_stop_words"),
    ("\n".join([PROSE[:80]] * 12 + [PROSE]), "gopher_duplicate_lines"),
    (PROSE + " quarterly budget review" * 60, "gopher_top_2gram"),
    (PROSE + " Lorem ipsum dolor sit amet.", "c4_lorem_ipsum"),
    (PROSE + " function f() { return 1; }", "c4_curly_brace"),
    (PROSE.replace(".", ","), "c4_too_few_sentences"),
])
def test_each_filter_drops_what_it_names(text, reason):
    assert quality_problem(text, SPEC) == reason


def test_pii_is_masked():
    assert mask_pii("write to ada.lovelace@example.org from 10.0.0.255 now") == \
        "write to <EMAIL> from <IP> now"
    assert mask_pii("version 1.2.3 and 999.1.1.1") == "version 1.2.3 and 999.1.1.1"


def test_the_cleaner_names_what_it_dropped_and_never_judges_code(tmp_path):
    from tests.data.conftest import clean_corpus, kept_texts

    short = "too short a text but long enough for min_chars, sure"
    docs = [PROSE + " write to ada@example.org", PROSE + " x { y }", short]
    job, store, receipt = clean_corpus(tmp_path, {"prose": docs}, min_chars=10,
                                       heldout_fraction=0.0, quality={}, mask_pii=True)
    assert receipt.sources["prose"].dropped == {"c4_curly_brace": 1, "gopher_word_count": 1}
    assert receipt.examples["prose"] == {"c4_curly_brace": "00001.txt",
                                         "gopher_word_count": "00002.txt"}
    assert kept_texts(job, store, "prose") == [PROSE + " write to <EMAIL>"]
    judge = DocumentFilter(min_chars=10, max_chars=10**6, quality=SPEC)
    assert not judge.judges_quality("code", code=True)
    code = RawDocument("c:0", "def f():\n    return {1: 2}")
    assert judge.judge(code, quality=judge.judges_quality("code", code=True))[1] is None
    skipping = DocumentFilter(min_chars=10, max_chars=10**6, quality=QualitySpec(skip_sources=["raw"]))
    assert not skipping.judges_quality("raw", code=False) and skipping.judges_quality("web", code=False)


def test_skip_sources_must_name_sources_and_the_mix_key_holds_when_off():
    from fm_pipeline.config import JobSpecError
    from fm_pipeline.data.manifest import mix_key
    from fm_pipeline.data.testing import small_job

    with pytest.raises(JobSpecError, match="skip_sources names no source: nope"):
        small_job(**{"data.quality": {"skip_sources": ["nope"]}})
    plain = small_job()
    assert mix_key(small_job(**{"data.mask_pii": False})) == mix_key(plain)
    assert mix_key(small_job(**{"data.quality": {}})) != mix_key(plain)


def test_drop_rates_outside_their_band_warn_naming_the_source():
    from fm_pipeline.data.corpus import CleanReceipt
    from fm_pipeline.data.manifest import DocumentCounts
    from fm_pipeline.data.validate import check_clean_corpus

    def counts(**dropped):
        return DocumentCounts(read=100, kept=100 - sum(dropped.values()), heldout=0,
                              chars_kept=1000, dropped=dropped)

    def outcome(**sources):
        receipt = CleanReceipt(mix_key="0" * 16, sources=sources, fingerprints={},
                               examples={})
        return {o.name: o for o in check_clean_corpus(receipt)}["filter_drop_rates"]

    fine = outcome(web=counts(near_duplicate=10, gopher_stop_words=20))
    assert fine.passed and fine.severity == "warn"
    harsh = outcome(web=counts(gopher_stop_words=50, c4_curly_brace=45), code=counts())
    assert not harsh.passed and "'web': (0.0, 0.95)" in harsh.description
    assert not outcome(web=counts(near_duplicate=60)).passed


def test_bands_come_from_the_job_spec_per_source_and_leave_the_mix_key_alone():
    from fm_pipeline.config.spec import DataChecksSpec
    from fm_pipeline.data.corpus import CleanReceipt
    from fm_pipeline.data.manifest import DocumentCounts, mix_key
    from fm_pipeline.data.validate import check_clean_corpus

    def counts(**dropped):
        return DocumentCounts(read=100, kept=100 - sum(dropped.values()), heldout=0,
                              chars_kept=1000, dropped=dropped)

    receipt = CleanReceipt(mix_key="0" * 16, fingerprints={}, examples={},
                           sources={"web": counts(near_duplicate=30), "code": counts()})

    def outcome(**checks):
        found = {o.name: o for o in check_clean_corpus(receipt, DataChecksSpec(**checks))}
        return found["filter_drop_rates"]

    assert outcome().passed  # 0.3 near-duplicates is inside the default [0, 0.5]
    tight = outcome(near_dedup_ratio=[0.0, 0.2])
    assert not tight.passed
    assert "web near_dedup_ratio 0.3000 outside [0, 0.2]" in tight.description
    assert "code" not in tight.description.split("per source:")[1].split(";", 1)[1]
    # A scraped source expected to hold 20-40% near-duplicates, and code expected to hold
    # some: each against its own band.
    own = outcome(near_dedup_ratio=[0.0, 0.2],
                  sources={"web": {"near_dedup_ratio": [0.2, 0.4]},
                           "code": {"near_dedup_ratio": [0.05, 0.5]}})
    assert not own.passed and "code near_dedup_ratio 0.0000 outside [0.05, 0.5]" in \
        own.description and "web near_dedup_ratio" not in own.description
    plain = small_job()
    banded = small_job(**{"data.checks": {"near_dedup_ratio": [0.1, 0.4]}})
    assert banded.data.checks.near_dedup_ratio == [0.1, 0.4]
    assert mix_key(banded) == mix_key(plain)  # the bands warn; the data is the same


@pytest.mark.parametrize("checks,message", [
    ({"dedup_ratio": [0.6, 0.2]}, r"dedup_ratio band \[0.6, 0.2\] must be \[low, high\]"),
    ({"quality_drop_rate": [0.0, 1.5]}, "quality_drop_rate band"),
    ({"sources": {"nowhere": {"dedup_ratio": [0, 0.1]}}}, "checks.sources names no source"),
])
def test_a_bad_band_is_refused_naming_it(checks, message):
    from fm_pipeline.config import JobSpecError

    with pytest.raises(JobSpecError, match=message):
        small_job(**{"data.checks": checks})
