"""Heuristic quality filters from Gopher (Rae et al. 2021, appendix A.1.1) and C4 (Raffel et
al. 2020, section 2.2), and optional PII masking. Each filter has a name, which is the drop
reason a document gets in the cleaning receipt (with its count and the first document it
dropped).

    why = quality_problem(text, QualitySpec())     # None, or e.g. "gopher_stop_words"
    text = mask_pii(text)                           # e-mail and IPv4 addresses replaced

Gopher: 50..100,000 words; mean word length 3..10; symbols (#, ...) per word <= 0.1; at
most 90% of lines start with a bullet and 30% end with an ellipsis; >= 80% of words hold a
letter; at least 2 of the English stop words the, be, to, of, and, that, have, with;
repetition: duplicate lines <= 30% of lines and <= 20% of characters, the most frequent
2-, 3-, 4-gram <= 20%, 18%, 16% of the characters. C4: no "lorem ipsum", no curly brace
(code and templates), at least 3 sentences. Code sources (python-code) are never filtered.
"""

from __future__ import annotations

import re
from collections import Counter

_WORD = re.compile(r"\S+")
_BULLETS = ("*", "-", "•", "‣", "◦", "⁃")
_STOP_WORDS = {"the", "be", "to", "of", "and", "that", "have", "with"}
_SENTENCE_END = re.compile(r"[.!?](\s|$)")
_EMAIL = re.compile(r"\b[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+\.[A-Za-z]{2,}\b")
_IPV4 = re.compile(r"\b(?:(?:25[0-5]|2[0-4]\d|1?\d?\d)\.){3}(?:25[0-5]|2[0-4]\d|1?\d?\d)\b")
TOP_NGRAM_MAX = {2: 0.20, 3: 0.18, 4: 0.16}


def quality_problem(text: str, spec) -> str | None:
    """The first filter `text` fails (its name), or None."""
    words = _WORD.findall(text)
    if spec.gopher:
        why = _gopher(text, words)
        if why:
            return why
    if spec.c4:
        lower = text.lower()
        if "lorem ipsum" in lower:
            return "c4_lorem_ipsum"
        if "{" in text:
            return "c4_curly_brace"
        if len(_SENTENCE_END.findall(text)) < 3:
            return "c4_too_few_sentences"
    return None


def _gopher(text: str, words: list[str]) -> str | None:
    n = len(words)
    if not 50 <= n <= 100_000:
        return "gopher_word_count"
    if not 3 <= sum(len(w) for w in words) / n <= 10:
        return "gopher_mean_word_length"
    if (text.count("#") + text.count("...") + text.count("…")) / n > 0.1:
        return "gopher_symbol_ratio"
    lines = [ln for ln in text.split("\n") if ln.strip()]
    if lines and sum(ln.lstrip().startswith(_BULLETS) for ln in lines) / len(lines) > 0.9:
        return "gopher_bullet_lines"
    if lines and sum(ln.rstrip().endswith(("...", "…")) for ln in lines) / len(lines) > 0.3:
        return "gopher_ellipsis_lines"
    if sum(any(c.isalpha() for c in w) for w in words) / n < 0.8:
        return "gopher_alphabetic_words"
    if len(_STOP_WORDS & {w.lower().strip(".,;:!?\"'") for w in words}) < 2:
        return "gopher_stop_words"
    return _repetition(text, lines, words)


def _repetition(text: str, lines: list[str], words: list[str]) -> str | None:
    counts = Counter(lines)
    duplicated = [ln for ln in lines if counts[ln] > 1]
    if lines and len(duplicated) / len(lines) > 0.3:
        return "gopher_duplicate_lines"
    if duplicated and sum(len(ln) for ln in duplicated) / max(len(text), 1) > 0.2:
        return "gopher_duplicate_line_chars"
    chars = sum(len(w) for w in words)
    for n, limit in TOP_NGRAM_MAX.items():
        grams = Counter(tuple(words[i:i + n]) for i in range(len(words) - n + 1))
        if not grams:
            continue
        gram, times = grams.most_common(1)[0]
        if times > 1 and times * sum(len(w) for w in gram) / chars > limit:
            return f"gopher_top_{n}gram"
    return None


def mask_pii(text: str) -> str:
    """E-mail addresses -> <EMAIL>, IPv4 addresses -> <IP>."""
    return _IPV4.sub("<IP>", _EMAIL.sub("<EMAIL>", text))
