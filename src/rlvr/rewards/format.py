"""R1 format reward: reasoning inside `<think>...</think>`, then the answer.

strict (default): the whole completion is `<think>` reasoning `</think>` answer, with exactly
one think block, non-empty reasoning and a non-empty answer, nothing before `<think>`; with
`answer_tag=True` the answer must be `<answer>...</answer>` and end the completion (the
R1-Zero template).
lenient: somewhere a `<think>...</think>` pair is followed by non-empty text.

Chat templates of reasoning models often end the prompt with `<think>`, so the completion
starts inside the reasoning; when the prompt ends with the opening tag, it is prepended before
checking (the rendered prompt is the trainer's `prompt_texts`; without it, `prompts`).
Score 1.0 or 0.0.
"""

from __future__ import annotations

import re

from rlvr.rewards.combine import completion_text, prompt_text

_LENIENT = re.compile(r"<think>.*?</think>\s*\S", re.DOTALL)


def _strict_ok(text: str, answer_tag: bool) -> bool:
    text = text.strip()
    if not text.startswith("<think>") or text.count("<think>") != 1:
        return False
    if text.count("</think>") != 1:
        return False
    reasoning, _, answer = text[len("<think>") :].partition("</think>")
    answer = answer.strip()
    if not reasoning.strip() or not answer:
        return False
    if answer_tag:
        return (
            answer.startswith("<answer>")
            and answer.endswith("</answer>")
            and answer.count("<answer>") == 1
            and answer.count("</answer>") == 1
            and bool(answer[len("<answer>") : -len("</answer>")].strip())
        )
    return True


def make_format_reward(*, mode: str = "strict", answer_tag: bool = False):
    """R1 format reward; `mode` is "strict" or "lenient" (see the module docstring)."""
    if mode not in ("strict", "lenient"):
        raise ValueError(f"format reward: mode must be 'strict' or 'lenient', got {mode!r}")

    def format(completions, prompts=None, prompt_texts=None, **kwargs) -> list[float | None]:
        rendered = prompt_texts or prompts or [""] * len(completions)
        out: list[float | None] = []
        for prompt, completion in zip(rendered, completions, strict=True):
            prompt, completion = prompt_text(prompt), completion_text(completion)
            if prompt.rstrip().endswith("<think>") and "<think>" not in completion:
                completion = "<think>" + completion
            if mode == "strict":
                ok = _strict_ok(completion, answer_tag)
            else:
                ok = _LENIENT.search(completion) is not None
            out.append(1.0 if ok else 0.0)
        return out

    return format
