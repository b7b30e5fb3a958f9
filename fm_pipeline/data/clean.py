"""Cleaning: UTF-8 decoding, normalisation, length and quality filters, exact and near
dedup, held-out split.

Each document is decoded as strict UTF-8 (a byte-order mark is dropped), newlines are
unified, control characters other than tab and newline removed, the text NFC-normalised,
and with `data.mask_pii` e-mail and IPv4 addresses masked. Then, in this order, it is
dropped as `empty`, `too_short` (< min_chars), `too_long` (> max_chars), a quality filter's
name with `data.quality` (`gopher_stop_words`, `c4_curly_brace`, ...: data/quality.py; never
for code sources), `duplicate` (same normalised text as an earlier document of any source of
the mix) or, with `data.near_dedup`, `near_duplicate` (MinHash + LSH: about as similar as a
kept document, data/near_dedup.py). Readers' problems (`not_utf8`, `malformed_json`,
`missing_field`, `syntax_error`, `unreadable`) are drop reasons too, and so is text that
cannot be encoded (`invalid_unicode`: a JSON record with a lone surrogate); the first
document of each reason is named (`file:line` for JSONL) in the receipt, and no single
record ever aborts the mix. A kept document goes to the held-out split when a hash of its
text falls below `heldout_fraction`, so the split does not depend on document order.
"""

from __future__ import annotations

import hashlib
import re
import unicodedata
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from fm_pipeline.data.manifest import DocumentCounts
from fm_pipeline.data.near_dedup import NearDuplicates
from fm_pipeline.data.quality import mask_pii, quality_problem
from fm_pipeline.data.sources import RawDocument

_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


@dataclass
class CleanDocument:
    doc_id: str
    text: str
    split: str  # "train" | "heldout"


@dataclass
class SourceCleaning:
    """Kept documents of one source plus the counts of what was dropped and why."""

    name: str
    documents: list[CleanDocument] = field(default_factory=list)
    read: int = 0
    dropped: Counter = field(default_factory=Counter)
    examples: dict[str, str] = field(default_factory=dict)  # reason -> first doc_id

    def drop(self, reason: str, doc_id: str) -> None:
        self.dropped[reason] += 1
        self.examples.setdefault(reason, doc_id)

    def counts(self) -> DocumentCounts:
        heldout = sum(d.split == "heldout" for d in self.documents)
        return DocumentCounts(
            read=self.read, kept=len(self.documents), heldout=heldout,
            chars_kept=sum(len(d.text) for d in self.documents),
            dropped=dict(sorted(self.dropped.items())),
        )


def normalize_text(content: bytes | str) -> str | None:
    """The cleaned text, or None when `content` is not valid Unicode: bytes that do not
    decode as UTF-8, or text that cannot be encoded (a lone surrogate such as "\\ud800")."""
    try:
        if isinstance(content, bytes):
            content = content.decode("utf-8")
        else:
            content.encode("utf-8")
    except (UnicodeDecodeError, UnicodeEncodeError):
        return None
    text = content.removeprefix("\ufeff").replace("\r\n", "\n").replace("\r", "\n")
    text = _CONTROL.sub("", text)
    return unicodedata.normalize("NFC", text).strip()


class Cleaner:
    """Cleans the sources of one mix in order; dedup spans all of them."""

    def __init__(self, *, min_chars: int, max_chars: int, heldout_fraction: float,
                 near_dedup=None, quality=None, mask_pii: bool = False):
        self.min_chars, self.max_chars = min_chars, max_chars
        self.heldout_fraction = heldout_fraction
        self._seen: set[bytes] = set()
        self._near = NearDuplicates(near_dedup) if near_dedup is not None else None
        self.quality, self.mask_pii = quality, mask_pii

    def clean_source(self, name: str, documents: Iterable[RawDocument], on_document=None, *,
                     code: bool = False) -> SourceCleaning:
        """`code`: the source holds code, which the quality filters never judge."""
        quality = self.quality if self.quality and not code and \
            name not in self.quality.skip_sources else None
        out = SourceCleaning(name)
        for doc in documents:
            out.read += 1
            if on_document:
                on_document()
            if doc.problem or doc.content is None:
                out.drop(doc.problem or "unreadable", doc.doc_id)
                continue
            text = normalize_text(doc.content)
            if text is not None and self.mask_pii:
                text = mask_pii(text)
            reason = self._reject(text) if text is not None else (
                "not_utf8" if isinstance(doc.content, bytes) else "invalid_unicode")
            if reason is None and quality is not None:
                reason = quality_problem(text, quality)
            if reason:
                out.drop(reason, doc.doc_id)
                continue
            digest = hashlib.blake2b(text.encode("utf-8"), digest_size=16).digest()
            if digest in self._seen:
                out.drop("duplicate", doc.doc_id)
                continue
            self._seen.add(digest)
            if self._near is not None and self._near.is_duplicate(text):
                out.drop("near_duplicate", doc.doc_id)
                continue
            out.documents.append(CleanDocument(doc.doc_id, text, self._split(digest)))
        self._ensure_heldout(out)
        return out

    def _reject(self, text: str | None) -> str | None:
        if text is None:
            return "not_utf8"
        if not text:
            return "empty"
        if len(text) < self.min_chars:
            return "too_short"
        if len(text) > self.max_chars:
            return "too_long"
        return None

    def _split(self, digest: bytes) -> str:
        return "heldout" if _unit(digest) < self.heldout_fraction else "train"

    def _ensure_heldout(self, out: SourceCleaning) -> None:
        # A small source may draw no held-out document by hash: hold out the one whose
        # hash is smallest, so every domain can be evaluated (needs >= 2 documents).
        docs = out.documents
        if self.heldout_fraction <= 0 or len(docs) < 2 or any(d.split == "heldout" for d in docs):
            return
        pick = min(docs, key=lambda d: hashlib.blake2b(d.text.encode("utf-8"), digest_size=16).digest())
        pick.split = "heldout"


def _unit(digest: bytes) -> float:
    return int.from_bytes(digest[:8], "big") / 2**64
