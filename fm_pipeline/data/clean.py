"""Cleaning one document: UTF-8 decoding, normalisation, length and quality filters.

Each document is decoded as strict UTF-8 (a byte-order mark is dropped), newlines are
unified, control characters other than tab and newline removed, the text NFC-normalised,
and with `data.mask_pii` e-mail and IPv4 addresses masked. Then, in this order, it is
dropped as `empty`, `too_short` (< min_chars), `too_long` (> max_chars) or, with
`data.quality`, a quality filter's name (`gopher_stop_words`, `c4_curly_brace`, ...:
data/quality.py; never for code sources). Readers' problems (`not_utf8`, `malformed_json`,
`missing_field`, `syntax_error`, `unreadable`) are drop reasons too, and so is text that
cannot be encoded (`invalid_unicode`: a JSON record with a lone surrogate); no single
record ever aborts the mix.

Deduplication spans the whole mix, so it is not decided here: a kept document's digest
(BLAKE2b-128 of its text) and, with near dedup, its MinHash signature go to the dedup
stages (data/dedup.py, data/clean_stages.py). The digest also places the document in the
held-out split (`heldout_fraction`), so the split does not depend on document order.
"""

from __future__ import annotations

import hashlib
import re
import unicodedata

from fm_pipeline.data.quality import mask_pii, quality_problem
from fm_pipeline.data.sources import RawDocument

_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


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


class DocumentFilter:
    """Judges documents one at a time: the cleaned text, or why the document is dropped."""

    def __init__(self, *, min_chars: int, max_chars: int, quality=None, mask_pii: bool = False):
        self.min_chars, self.max_chars = min_chars, max_chars
        self.quality, self.mask_pii = quality, mask_pii

    @classmethod
    def of(cls, data_spec) -> DocumentFilter:
        return cls(min_chars=data_spec.min_chars, max_chars=data_spec.max_chars,
                   quality=data_spec.quality, mask_pii=data_spec.mask_pii)

    def judges_quality(self, source: str, *, code: bool) -> bool:
        """Code sources and `quality.skip_sources` are never judged by the quality filters."""
        return bool(self.quality) and not code and source not in self.quality.skip_sources

    def judge(self, doc: RawDocument, *, quality: bool = False) -> tuple[str | None, str | None]:
        """(text, None) for a kept document, (None, reason) for a dropped one."""
        if doc.problem or doc.content is None:
            return None, doc.problem or "unreadable"
        text = normalize_text(doc.content)
        if text is None:
            return None, "not_utf8" if isinstance(doc.content, bytes) else "invalid_unicode"
        if self.mask_pii:
            text = mask_pii(text)
        reason = self._length(text)
        if reason is None and quality:
            reason = quality_problem(text, self.quality)
        return (None, reason) if reason else (text, None)

    def _length(self, text: str) -> str | None:
        if not text:
            return "empty"
        if len(text) < self.min_chars:
            return "too_short"
        if len(text) > self.max_chars:
            return "too_long"
        return None


def text_digest(text: str) -> bytes:
    """What exact dedup compares: BLAKE2b-128 of the cleaned text."""
    return hashlib.blake2b(text.encode("utf-8"), digest_size=16).digest()


def heldout_by_hash(digest: bytes, fraction: float) -> bool:
    return int.from_bytes(digest[:8], "big") / 2**64 < fraction
