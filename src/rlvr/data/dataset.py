"""Prompt datasets: jsonl, parquet, and local Hugging Face datasets, as `PromptExample`s.

    load_prompt_dataset(path, format=..., prompt_field=..., answer_field=...) -> [PromptExample]
    render_prompt(example, tokenizer, template=..., system_prompt=...) -> str

Sources: `.jsonl` (one JSON object a line; blank lines skipped; `.jsonl.gz` gzipped), `.json` (a JSON array, or
JSON lines), `.parquet`, a directory written by `datasets.save_to_disk`, or any other local
data files / directory that `datasets.load_dataset` reads (csv, arrow, a folder of files).
Nothing is downloaded.

Formats (`data.format`):
  "gsm8k": prompt "question", answer "answer" whose final answer follows `####` (the
           reasoning before it is kept in the column "solution");
  "dapo_math": prompt "prompt" (a list of chat messages), answer
           "reward_model.ground_truth" (dotted names reach into nested objects). The public
           DAPO-Math-17k copy repeats each prompt ~100 times: pass dedup=True.
  "humaneval", "mbpp", "apps", "codecontests": the code benchmarks' own formats, each row
           turned into a code-reward row (`rlvr.data.code` documents each);
  "none": prompt "prompt", answer "answer".
A format's fields apply unless other ones are given (the generic "prompt"/"answer" do not
override a format's).

A prompt is a non-empty string or a non-empty list of {"role", "content"} messages. An
answer is a non-empty string or a number. A dataset may be prompt-only, as TRL's default is:
with the generic fields (format "none", no `answer_field` given) and no "answer" column in
its first row, every example's `answer` is None and rewards receive no `answer` (a reward
that needs one is refused by name when the run is built); a later row that has one is then
refused, as is a missing answer after a first row that had one. Every other top-level column (the answer's own
column too, unless it is named "answer") is kept in `columns` and reaches reward functions
as a keyword argument; the parsed reference reaches them as `answer`. A bad row raises
`DatasetError` naming the file, the line (jsonl, 1-based) or row (other formats, 0-based)
and the field.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlvr.config.formats import CODE_FORMATS
from rlvr.data.code import FIELDS as CODE_FIELDS
from rlvr.data.code import code_row
from rlvr.data.errors import DatasetError
from rlvr.data.text import decode_line, json_lines_of, one_line, parse_json, utf8_bytes

FORMATS: dict[str, dict[str, str]] = {
    "none": {"prompt_field": "prompt", "answer_field": "answer"},
    "gsm8k": {"prompt_field": "question", "answer_field": "answer"},
    "dapo_math": {"prompt_field": "prompt", "answer_field": "reward_model.ground_truth"},
    **CODE_FIELDS,  # humaneval, mbpp, apps, codecontests: rlvr.data.code
}


@dataclass(frozen=True)
class PromptExample:
    """One prompt: `prompt` (a string) or `messages` (chat messages), never both; `answer`,
    the reference as a string (None in a prompt-only dataset); `columns`, the row's other top-level fields; `source`, where
    it came from ("file.jsonl:12" for a line, "file.parquet[3]" for a row)."""

    answer: str | None
    prompt: str | None = None
    messages: list[dict] | None = None
    columns: dict[str, Any] = field(default_factory=dict)
    source: str = ""


def _rows(path: Path, split: str):
    """(where, row) pairs; a bad JSON line raises DatasetError."""
    name = path.name
    gz = path.name.endswith(".jsonl.gz")
    if path.is_file() and (path.suffix in (".jsonl", ".json") or gz):
        data = utf8_bytes(path)
        if path.suffix == ".json" and data.lstrip().startswith(b"["):
            rows = parse_json(decode_line(data, name, 0), name, None)
            if not isinstance(rows, list):
                raise DatasetError(name, None, "expected a JSON array of objects")
            for i, r in enumerate(rows):
                yield _checked_text(f"{name}[{i}]", r)
            return
        for lineno, row in json_lines_of(data, name):
            yield _checked_text(f"{name}:{lineno}", row)
        return
    if path.is_file() and path.suffix == ".parquet":
        import pyarrow
        import pyarrow.parquet as pq

        try:
            table = pq.read_table(path)
        except (pyarrow.ArrowException, OSError) as e:
            raise DatasetError(name, None, f"not a readable parquet file ({one_line(e)})") from None
        yield from ((f"{name}[{i}]", r) for i, r in enumerate(table.to_pylist()))
        return
    if path.is_dir() and path.suffix in (".jsonl", ".json", ".parquet"):
        raise DatasetError(name, None, f"is a directory, not a {path.suffix} file")
    try:
        rows = _hf_rows(path, split)
    except DatasetError:
        raise
    except Exception as e:  # datasets' own errors: empty directory, no data files, bad csv
        raise DatasetError(name, None, f"cannot be read as a dataset: {one_line(e)}") from None
    yield from ((f"{name}[{i}]", r) for i, r in enumerate(rows))


def _checked_text(where: str, row):
    """(where, row), or DatasetError naming the field when a string holds a lone surrogate
    (a `\\ud800`-`\\udfff` JSON escape outside a pair): no text encoding can hold it, and the
    tokenizer would fail on it much later."""
    if not isinstance(row, dict):
        return where, row
    for key, value in row.items():
        try:
            json.dumps(value, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            raise DatasetError(
                where, str(key), "holds a lone surrogate escape (\\ud800-\\udfff not in a pair)"
            ) from None
    return where, row


def _hf_rows(path: Path, split: str):
    import datasets

    if path.is_dir() and (
        (path / "dataset_info.json").exists() or (path / "dataset_dict.json").exists()
    ):
        ds = datasets.load_from_disk(str(path))
    elif path.is_dir():
        ds = datasets.load_dataset(str(path), split=split)
    else:
        builder = {".csv": "csv", ".arrow": "arrow", ".txt": "text"}.get(path.suffix)
        if builder is None:
            raise DatasetError(path.name, None, f"unknown file type {path.suffix!r}")
        ds = datasets.load_dataset(builder, data_files=str(path), split="train")
    if isinstance(ds, datasets.DatasetDict):
        if split not in ds:
            raise DatasetError(path.name, None, f"no split {split!r}; splits: {sorted(ds)}")
        ds = ds[split]
    return iter(ds)


def _get(row: dict, dotted: str, where: str):
    value: Any = row
    for part in dotted.split("."):
        if not isinstance(value, dict) or part not in value:
            raise DatasetError(where, dotted, "missing")
        value = value[part]
    return value


def _has(row: dict, dotted: str) -> bool:
    value: Any = row
    for part in dotted.split("."):
        if not isinstance(value, dict) or part not in value:
            return False
        value = value[part]
    return True


_LIKELY = {
    "prompt": ("prompt", "question", "problem", "query", "input", "instruction", "messages"),
    "answer": ("answer", "solution", "ground_truth", "target", "label", "output", "reference"),
}


def _missing_hint(row: dict, role: str, name: str) -> str:
    """What to do about a missing prompt/answer column: the row's columns, the likeliest one
    as a `--data.{role}_field=...` setting, and a format whose fields the row has."""
    columns = ", ".join(map(str, row)) or "none"
    text = f"missing; the row's columns are: {columns}."
    likely = [c for c in _LIKELY[role] if c in row and c != name]
    if likely:
        text += f" Name the {role} column with --data.{role}_field={likely[0]}"
    formats = [
        p
        for p, f in FORMATS.items()
        if p != "none" and _has(row, f["prompt_field"]) and _has(row, f["answer_field"])
    ]
    if formats:
        text += (" or" if likely else "") + f" use the format --data.format={formats[0]}"
    elif not likely:
        text += f" Name the {role} column with --data.{role}_field=COLUMN"
    return text


def _check_prompt(value, where: str, name: str):
    if isinstance(value, str):
        if not value.strip():
            raise DatasetError(where, name, "empty prompt")
        return value, None
    if isinstance(value, list):
        if not value:
            raise DatasetError(where, name, "empty list of messages")
        for i, m in enumerate(value):
            if not (isinstance(m, dict) and isinstance(m.get("role"), str)):
                raise DatasetError(where, f"{name}[{i}]", "expected {'role': str, 'content': str}")
            if not isinstance(m.get("content"), str):
                raise DatasetError(where, f"{name}[{i}].content", "expected a string")
        if not any(m["content"].strip() for m in value):
            raise DatasetError(where, name, "every message is empty")
        return None, [{"role": m["role"], "content": m["content"]} for m in value]
    raise DatasetError(
        where, name, f"expected a string or a list of chat messages, got {type(value).__name__}"
    )


def _check_answer(value, where: str, name: str, format: str) -> tuple[str, dict]:
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise DatasetError(
            where, name, f"expected a string or a number, got {type(value).__name__}"
        )
    text = str(value).strip()
    extra = {}
    if format == "gsm8k":
        solution, sep, final = text.rpartition("####")
        if not sep:
            raise DatasetError(where, name, "no '####' before the final answer (gsm8k format)")
        text, extra = final.strip(), {"solution": solution.strip()}
    if not text:
        raise DatasetError(where, name, "empty answer")
    return text, extra


def load_prompt_dataset(
    path: str | Path,
    *,
    format: str = "none",
    prompt_field: str | None = None,
    answer_field: str | None = None,
    dedup: bool = False,
    split: str = "train",
    limit: int | None = None,
) -> list[PromptExample]:
    """Read every row of `path` into a PromptExample (see the module docstring).

    dedup drops rows whose prompt repeats an earlier one (first kept). split picks the split
    of a Hugging Face DatasetDict. limit stops after that many examples (after dedup).
    """
    if format not in FORMATS:
        raise ValueError(f"unknown dataset format {format!r}; valid: {sorted(FORMATS)}")
    path = Path(path).expanduser()
    if not path.exists():
        raise FileNotFoundError(f"dataset {str(path)!r} does not exist")
    fields = FORMATS[format]
    generic = FORMATS["none"]
    optional_answer = format == "none" and answer_field in (None, generic["answer_field"])
    if prompt_field is None or prompt_field == generic["prompt_field"]:
        prompt_field = fields["prompt_field"]
    if answer_field is None or answer_field == generic["answer_field"]:
        answer_field = fields["answer_field"]

    out: list[PromptExample] = []
    seen: set[str] = set()
    prompt_only: bool | None = None  # decided by the first row
    for where, row in _rows(path, split):
        if not isinstance(row, dict):
            raise DatasetError(where, None, f"expected an object, got {type(row).__name__}")
        if format in CODE_FORMATS:
            row = code_row(format, row, where)
        if prompt_only is None:
            prompt_only = (
                optional_answer and not _has(row, answer_field) and _has(row, prompt_field)
            )
        roles = (("prompt", prompt_field),) if prompt_only else (
            ("prompt", prompt_field), ("answer", answer_field))  # fmt: skip
        for role, name in roles:
            if not _has(row, name):
                raise DatasetError(where, name, _missing_hint(row, role, name))
        prompt, messages = _check_prompt(_get(row, prompt_field, where), where, prompt_field)
        if prompt_only and answer_field in row:
            raise DatasetError(
                where, answer_field, "present, but the first row has none (a prompt-only "
                "dataset): every row or none holds the reference answer",
            )  # fmt: skip
        answer, extra = None, {}
        if not prompt_only:
            value = _get(row, answer_field, where)
            answer, extra = _check_answer(value, where, answer_field, format)
        if dedup:
            key = prompt if prompt is not None else json.dumps(messages, sort_keys=True)
            if key in seen:
                continue
            seen.add(key)
        # every column but the prompt reaches rewards, as in TRL; the parsed reference is
        # passed as `answer`, which therefore replaces a raw column of that name
        top = {prompt_field.split(".")[0], "answer"}
        columns = {k: v for k, v in row.items() if k not in top} | extra
        out.append(PromptExample(answer, prompt, messages, columns, where))
        if limit is not None and len(out) >= limit:
            break
    return out


def build_messages(
    example: PromptExample, *, template: str | None = None, system_prompt: str | None = None
) -> list[dict]:
    """The chat messages of `example`: a string prompt goes through `template` (its
    `{question}` replaced; other braces, e.g. LaTeX, are left alone) as the user message;
    `system_prompt` is put first (an example that has its own system message refuses one)."""
    if example.messages is not None:
        messages = [dict(m) for m in example.messages]
    else:
        content = example.prompt
        if template is not None:
            if "{question}" not in template:
                raise ValueError(f"prompt template must contain {{question}}: {template!r}")
            content = template.replace("{question}", example.prompt)
        messages = [{"role": "user", "content": content}]
    if system_prompt:
        if messages[0]["role"] == "system":
            raise ValueError(
                f"{example.source}: the example has its own system message; "
                "unset system_prompt or remove it from the data"
            )
        messages = [{"role": "system", "content": system_prompt}, *messages]
    return messages


def render_prompt(
    example: PromptExample,
    tokenizer,
    *,
    template: str | None = None,
    system_prompt: str | None = None,
) -> str:
    """The prompt text the policy continues: the tokenizer's chat template with a generation
    prompt when it has one, else the message contents joined by newlines (plus one)."""
    messages = build_messages(example, template=template, system_prompt=system_prompt)
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return "\n".join(m["content"] for m in messages) + "\n"
