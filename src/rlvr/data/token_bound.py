"""How many characters one token can stand for, read off a fast tokenizer's parts, so a prompt
that cannot fit the context is refused from its length alone, before it is tokenized.

Tokenizing costs memory in proportion to the text whatever `truncation` says (measured: a
10 MB prompt through the built-in tokenizer peaks at 3.9 GB, 4.1 GB with truncation to 200
tokens; `encode_batch_fast` 3.2 GB). The bound: every token covers at most `span` characters
of the normalized text (its vocabulary string's length: byte-level, SentencePiece `▁` and
byte-fallback tokens cover no more than they spell), the normalizer shrinks the text by at
most `shrink` (NFC/NFKC: 4, the longest canonical decomposition), and no part drops text.
Then tokens >= ceil(chars / (span * shrink)), and a prompt past `budget * span * shrink`
characters is provably too long. Where a part gives no such guarantee (an unknown-token that
may swallow a whole word, a normalizer or pre-tokenizer that deletes text, an added token
that strips the spaces around it), `chars_per_token` is None and prompts are tokenized whole.
"""

from __future__ import annotations

import json
import math

UNICODE_FORMS = ("NFC", "NFD", "NFKC", "NFKD")
# UAX #15: no code point decomposes canonically into more than 4, so composing (NFC, NFKC)
# shrinks a text at most 4-fold; decomposition and lowercasing never shrink it
MAX_CANONICAL_DECOMPOSITION = 4
KEEPING_PRE_TOKENIZERS = ("ByteLevel", "Metaspace", "Digits", "UnicodeScripts", "Punctuation")
ONE_CHARACTER_PATTERNS = ("[\\s\\S]", "[\\S\\s]", "(?s:.)", "(?s).")


def chars_per_token(tokenizer) -> float | None:
    """The most characters of input one token of `tokenizer` can stand for, or None when its
    parts do not bound it (see the module docstring)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:  # a slow (Python) tokenizer: nothing to read
        return None
    spec = json.loads(backend.to_str())
    shrink = _shrink(spec.get("normalizer"))
    pieces = _piece_limit(spec.get("pre_tokenizer"))
    if shrink is None or pieces is None or not _model_bounded(spec["model"], pieces):
        return None
    if any(t.get("lstrip") or t.get("rstrip") for t in spec.get("added_tokens", [])):
        return None
    span = max((len(t) for t in tokenizer.get_vocab()), default=0)
    return float(max(span, 1) * shrink) if span else None


def min_tokens(text: str, per_token: float) -> int:
    return math.ceil(len(text) / per_token)


def _shrink(normalizer: dict | None) -> float | None:
    """The most the normalizer can shorten a text (1 = never), None when unbounded."""
    if normalizer is None:
        return 1.0
    kind = normalizer["type"]
    if kind in UNICODE_FORMS:
        return float(MAX_CANONICAL_DECOMPOSITION)
    if kind in ("Lowercase", "Prepend"):
        return 1.0
    if kind == "Replace":
        pattern, content = normalizer["pattern"], normalizer["content"]
        if "String" not in pattern or not content:
            return None  # a regex, or a deletion: no bound
        return max(1.0, len(pattern["String"]) / len(content))
    if kind == "Sequence":
        factors = [_shrink(n) for n in normalizer["normalizers"]]
        return None if None in factors else math.prod(factors)
    return None  # Strip, StripAccents, BertNormalizer, Precompiled, ...: may delete text


def _piece_limit(pre: dict | None) -> float | None:
    """The longest piece (in characters) the pre-tokenizer cuts, math.inf when unlimited, and
    None when it may drop text (whitespace splitters, Split with behavior Removed)."""
    if pre is None:
        return math.inf
    kind = pre["type"]
    if kind in KEEPING_PRE_TOKENIZERS:
        return math.inf if pre.get("behavior") != "Removed" else None
    if kind == "Split":
        if pre.get("behavior") == "Removed":
            return None
        one = pre.get("pattern", {}).get("Regex") in ONE_CHARACTER_PATTERNS
        return 1.0 if one and pre.get("behavior") == "Isolated" and not pre["invert"] else math.inf
    if kind == "Sequence":
        limits = [_piece_limit(p) for p in pre["pretokenizers"]]
        return None if None in limits else min(limits)
    return None  # Whitespace, WhitespaceSplit, BertPreTokenizer, CharDelimiterSplit: drop text


def _model_bounded(model: dict, piece_limit: float) -> bool:
    """Whether every token covers at most its vocabulary string: an unknown-token may stand
    for a run of unknown characters (BPE/Unigram fusing them) or a whole piece (WordLevel,
    WordPiece), unless byte fallback spells unknowns out or pieces are single characters."""
    kind = model["type"]
    if kind == "BPE":
        return not model.get("unk_token") or model.get("byte_fallback") or not model["fuse_unk"]
    if kind == "Unigram":
        return model.get("unk_id") is None or bool(model.get("byte_fallback"))
    if kind in ("WordLevel", "WordPiece"):
        return piece_limit <= 1
    return False
