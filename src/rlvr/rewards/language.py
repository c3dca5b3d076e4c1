"""Language consistency (DeepSeek-R1): the share of target-language words in the reasoning.

The reasoning is the text inside the first `<think>...</think>` (or from the start up to
`</think>` when the prompt opened the tag, or the whole completion when there are no tags).
Words are runs of letters (digits, symbols and LaTeX punctuation are ignored); each CJK
character counts as one word, since those scripts do not separate words with spaces.
Targets are simple heuristics, not language identification:
  "en": a word is English when it is all ASCII letters (so French or German written without
        accents counts as English; that is the price of needing no model);
  "zh": a word is Chinese when it is a CJK ideograph.
Score in [0, 1]; None ("no score") when the reasoning has no words.
"""

from __future__ import annotations

import re

from rlvr.rewards.combine import completion_text

_WORD = re.compile(
    r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]|[^\W\d_\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]+"
)
_CJK = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]")

TARGETS = {
    "en": lambda w: w.isascii(),
    "zh": lambda w: _CJK.fullmatch(w) is not None,
}


def reasoning_text(completion: str) -> str:
    end = completion.find("</think>")
    if end == -1:
        start = completion.find("<think>")
        return completion if start == -1 else completion[start + len("<think>") :]
    start = completion.rfind("<think>", 0, end)
    return completion[(0 if start == -1 else start + len("<think>")) : end]


def language_share(text: str, target: str = "en") -> float | None:
    """Share of words of `text` in `target`, None when `text` has no words."""
    words = _WORD.findall(text)
    if not words:
        return None
    is_target = TARGETS[target]
    return sum(1 for w in words if is_target(w)) / len(words)


def make_language_reward(*, target: str = "en"):
    """Language-consistency reward for `target` ("en" or "zh")."""
    if target not in TARGETS:
        raise ValueError(
            f"language reward: target must be one of {sorted(TARGETS)}, got {target!r}"
        )

    def language(completions, **kwargs) -> list[float | None]:
        return [language_share(reasoning_text(completion_text(c)), target) for c in completions]

    return language
