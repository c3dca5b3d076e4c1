"""Math accuracy: extract the final answer, decide equivalence with math-verify.

Extraction (`extract_answer`), in this order, the last occurrence of each winning:
  1. `\\boxed{...}` / `\\fbox{...}` with nested braces (escaped `\\{ \\}` do not count);
  2. `<answer>...</answer>` (R1-Zero template);
  3. an `Answer:` line (DAPO's prompt asks for "Answer: $Answer" on the last line);
  4. a `#### ...` line (GSM8K's own format);
  5. optionally (`number_fallback=True`) the last number in the text.
Extraction is a linear scan: no regex backtracking on a 1 MB completion.

Equivalence (`math_equal`): exact match after light normalisation, then exact decimal
comparison when both sides are plain numbers, then math-verify (LaTeX, fractions, percentages,
intervals, sets, equations) in a child process that is killed when a call runs past
`timeout_s`. math-verify's own timeout uses SIGALRM, which works only in the main thread and
cannot interrupt sympy's C arithmetic (`10^{10^{10}}` never returns), hence the process.
Answers longer than `MAX_ANSWER_CHARS` or nested deeper than `MAX_BRACE_DEPTH` are "not equal"
without being parsed. Model output is never passed to eval/exec. `start_verifier()` starts
the worker ahead of the first call (about a second to import sympy).
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

from rlvr.rewards._verifier import verify_in_worker, warm_up
from rlvr.rewards.combine import completion_text

MAX_ANSWER_CHARS = 1000
MAX_BRACE_DEPTH = 50

_BOX_COMMANDS = ("\\boxed", "\\fbox")
# Greedy `(.*)` and a strip afterwards: a lazy group before `[ \t]*$` backtracks
# quadratically on a long run of spaces.
_ANSWER_LINE = re.compile(r"(?im)^[ \t*]*answer[ \t*]*:(.*)$")
_GSM8K_LINE = re.compile(r"(?m)^[ \t]*####(.*)$")
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?|-?\.\d+")
_PLAIN_NUMBER = re.compile(r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|[-+]?\.\d+")


_BRACE_OR_ESCAPE = re.compile(r"\\.|[{}]", re.DOTALL)


def _braced(text: str, open_at: int) -> str | None:
    """The content of the group whose `{` is at `open_at`, or None if it never closes."""
    depth = 0
    for m in _BRACE_OR_ESCAPE.finditer(text, open_at):
        c = m.group()
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return text[open_at + 1 : m.start()]
        # an escape (\{, \}, \\, \frac...) skips its next character
    return None


def _last_boxed(text: str) -> str | None:
    best_at, best = -1, None
    for cmd in _BOX_COMMANDS:
        at = text.rfind(cmd + "{")
        for _ in range(3):  # a few unclosed ones at most: each try scans to the end
            if at == -1:
                break
            content = _braced(text, at + len(cmd))
            if content is not None:
                if at > best_at:
                    best_at, best = at, content
                break
            at = text.rfind(cmd + "{", 0, at)  # unclosed: try the one before
        # "\boxed 5" (no braces) as some models write it
        at = text.rfind(cmd + " ")
        if at > best_at:
            token = text[at + len(cmd) + 1 :].split(None, 1)
            if token:
                best_at, best = at, token[0].rstrip("$.")
    return best


def _last_tagged(text: str, tag: str) -> str | None:
    end = text.rfind(f"</{tag}>")
    if end == -1:
        return None
    start = text.rfind(f"<{tag}>", 0, end)
    if start == -1:
        return None
    return text[start + len(tag) + 2 : end]


def _clean(ans: str) -> str:
    ans = ans.strip().strip("*").strip()
    if len(ans) >= 2 and ans[0] == "$" and ans[-1] == "$":
        ans = ans.strip("$").strip()
    return ans.rstrip(".").strip()


def extract_answer(text: str, *, number_fallback: bool = False) -> str | None:
    """The final answer as the math reward sees it, or None when there is none.

    See the module docstring for the order of formats. `number_fallback` adds the last number
    in the text (commas kept, e.g. "1,000") as a last resort.
    """
    if not isinstance(text, str) or not text:
        return None
    for found in (
        _last_boxed(text),
        _last_tagged(text, "answer"),
    ):
        if found is not None:
            inner = _last_boxed(found)  # "<answer>so \boxed{5}</answer>"
            found = _clean(inner if inner is not None else found)
            if found:
                return found
    for pattern in (_ANSWER_LINE, _GSM8K_LINE):
        matches = pattern.findall(text)
        if matches and _clean(matches[-1]):
            return _clean(matches[-1])
    if number_fallback:
        numbers = _NUMBER.findall(text[-10_000:])
        if numbers:
            return numbers[-1].rstrip(".")
    return None


_STRIP = re.compile(r"\\left|\\right|\\!|\\,|\\;|\\ |\s|\$|\\displaystyle")


def _normalise(s: str) -> str:
    s = _STRIP.sub("", s).rstrip(".")
    return s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")


def _as_decimal(s: str) -> Decimal | None:
    s = s.strip().removeprefix("\\$").strip()
    if not _PLAIN_NUMBER.fullmatch(s):
        return None
    try:
        return Decimal(s.replace(",", ""))
    except InvalidOperation:
        return None


def _too_deep(s: str) -> bool:
    depth = 0
    for c in s:
        if c in "{([":
            depth += 1
            if depth > MAX_BRACE_DEPTH:
                return True
        elif c in "})]":
            depth -= 1
    return False


def math_equal(prediction: str, reference: str, *, timeout_s: float = 0.5) -> bool:
    """True when `prediction` and `reference` are the same mathematical answer.

    Both are bare answers (what `extract_answer` returns), e.g. "\\frac{1}{2}" and "0.5".
    `timeout_s` bounds the math-verify call in wall-clock seconds; a timeout is "not equal".
    """
    if not isinstance(prediction, str) or not isinstance(reference, str):
        return False
    prediction, reference = _clean(prediction), _clean(reference)
    if not prediction or not reference:
        return False
    if len(prediction) > MAX_ANSWER_CHARS or len(reference) > MAX_ANSWER_CHARS:
        return False
    if _normalise(prediction) == _normalise(reference):
        return True
    p, r = _as_decimal(prediction), _as_decimal(reference)
    if p is not None and r is not None:
        return p == r
    if _too_deep(prediction) or _too_deep(reference):
        return False
    return verify_in_worker(prediction, reference, timeout_s=timeout_s)


def start_verifier() -> None:
    """Start the math-verify worker now (or wait for a replacement to finish starting)."""
    warm_up()


def make_math_reward(
    *,
    signed: bool = False,
    number_fallback: bool = False,
    timeout_s: float = 0.5,
    answer_field: str | None = None,
):
    """Accuracy reward: 1 if the extracted answer equals the reference (`answer`), else 0 (or
    -1 with `signed=True`, DAPO's +1/-1). A completion with no extractable answer is wrong. A
    sample whose reference is empty gets None ("no score"). `answer_field` reads the reference
    from another dataset column instead of `answer`.
    """
    wrong = -1.0 if signed else 0.0

    def math(completions, answer=None, **kwargs) -> list[float | None]:
        refs = kwargs[answer_field] if answer_field else answer
        if refs is None:
            raise ValueError("math needs the reference answer (keyword argument 'answer')")
        out: list[float | None] = []
        for completion, ref in zip(completions, refs, strict=True):
            ref = "" if ref is None else str(ref)
            if not ref.strip():
                out.append(None)
                continue
            text = completion_text(completion)
            pred = extract_answer(text, number_fallback=number_fallback)
            ok = pred is not None and math_equal(pred, ref, timeout_s=timeout_s)
            out.append(1.0 if ok else wrong)
        return out

    math.needs_reference = answer_field is None  # else the column it names
    return math
