"""Prompt datasets: every source file type, both text formats, dedup, rendering, and the errors a
malformed row must raise (file, line or row, field)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from rlvr.data.dataset import PromptExample, load_prompt_dataset, render_prompt
from rlvr.data.errors import DatasetError

FIXTURES = Path(__file__).parent / "fixtures"
ROOT = Path(__file__).parents[1]


def test_fixtures_are_what_the_script_writes():
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "make_fixtures.py"), "--check"])
    assert r.returncode == 0, "run `python scripts/make_fixtures.py` to refresh tests/fixtures"


def test_gsm8k_format():
    rows = load_prompt_dataset(FIXTURES / "gsm8k_sample.jsonl", format="gsm8k")
    assert len(rows) == 64
    first = rows[0]
    assert first.prompt.startswith("Gus has 5 marbles") and first.messages is None
    assert first.answer == "4"
    assert first.columns == {"solution": "Gus has 5 - 1 = 4 marbles left."}
    assert first.source == "gsm8k_sample.jsonl:1"
    # the config's generic field names do not override the format's
    same = load_prompt_dataset(
        FIXTURES / "gsm8k_sample.jsonl",
        format="gsm8k",
        prompt_field="prompt",
        answer_field="answer",
    )
    assert same == rows


@pytest.mark.parametrize("name", ["dapo_math_sample.jsonl", "dapo_math_sample.parquet"])
def test_dapo_format_and_dedup(name):
    rows = load_prompt_dataset(FIXTURES / name, format="dapo_math")
    assert len(rows) == 18
    unique = load_prompt_dataset(FIXTURES / name, format="dapo_math", dedup=True)
    assert len(unique) == 6
    assert unique[0].messages[0]["role"] == "user"
    assert "Answer:" in unique[0].messages[0]["content"]
    assert [r.answer for r in unique] == ["100", "2", "5", "9", "15", "12"]
    assert unique[0].columns["data_source"] == "math_dapo"
    # the answer's column reaches rewards too (TRL passes every column but the prompt)
    assert unique[0].columns["reward_model"]["ground_truth"] == "100"
    assert "prompt" not in unique[0].columns


def test_local_hf_datasets(tmp_path):
    import datasets

    rows = [
        {"question": "What is 1+1?", "answer": "x\n#### 2"},
        {"question": "2+2?", "answer": "#### 4"},
    ]
    ds = datasets.Dataset.from_list(rows)
    ds.save_to_disk(str(tmp_path / "saved"))
    datasets.DatasetDict({"train": ds, "test": ds.select([1])}).save_to_disk(str(tmp_path / "dd"))
    ds.to_csv(str(tmp_path / "data.csv"))
    a = load_prompt_dataset(tmp_path / "saved", format="gsm8k")
    b = load_prompt_dataset(tmp_path / "dd", format="gsm8k", split="test")
    c = load_prompt_dataset(tmp_path / "data.csv", format="gsm8k")
    assert [x.answer for x in a] == ["2", "4"] and a[1].source == "saved[1]"
    assert [x.answer for x in b] == ["4"]
    assert [x.answer for x in c] == ["2", "4"]
    with pytest.raises(DatasetError, match="no split 'validation'"):
        load_prompt_dataset(tmp_path / "dd", format="gsm8k", split="validation")


def test_json_array_numbers_and_limit(tmp_path):
    path = tmp_path / "d.json"
    path.write_text(json.dumps([{"q": "a?", "a": 3}, {"q": "b?", "a": 1.5}, {"q": "c?", "a": "x"}]))
    rows = load_prompt_dataset(path, prompt_field="q", answer_field="a", limit=2)
    assert [r.answer for r in rows] == ["3", "1.5"] and rows[1].source == "d.json[1]"


def _jsonl(tmp_path, *lines: str) -> Path:
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


GOOD = json.dumps({"prompt": "q?", "answer": "1"})


@pytest.mark.parametrize(
    ("line", "where", "field", "message"),
    [
        ('{"prompt": "q?", "answer": ', "bad.jsonl:3", None, "bad JSON"),
        ('["a list"]', "bad.jsonl:3", None, "expected an object"),
        ('{"answer": "1"}', "bad.jsonl:3", "prompt", "missing"),
        ('{"prompt": "q?"}', "bad.jsonl:3", "answer", "missing"),
        ('{"prompt": 7, "answer": "1"}', "bad.jsonl:3", "prompt", "got int"),
        ('{"prompt": "  ", "answer": "1"}', "bad.jsonl:3", "prompt", "empty prompt"),
        ('{"prompt": [], "answer": "1"}', "bad.jsonl:3", "prompt", "empty list"),
        (
            '{"prompt": [{"role": "user"}], "answer": "1"}',
            "bad.jsonl:3",
            "prompt[0].content",
            "expected a string",
        ),
        ('{"prompt": ["hi"], "answer": "1"}', "bad.jsonl:3", "prompt[0]", "role"),
        ('{"prompt": "q?", "answer": ""}', "bad.jsonl:3", "answer", "empty answer"),
        ('{"prompt": "q?", "answer": null}', "bad.jsonl:3", "answer", "got NoneType"),
        ('{"prompt": "q?", "answer": true}', "bad.jsonl:3", "answer", "got bool"),
    ],
)
def test_malformed_rows_name_file_line_and_field(tmp_path, line, where, field, message):
    path = _jsonl(tmp_path, GOOD, "", line)  # line 2 is blank and skipped
    with pytest.raises(DatasetError, match=message) as e:
        load_prompt_dataset(path)
    assert e.value.where == where and e.value.field == field
    assert str(e.value).startswith(where)


def test_malformed_formats(tmp_path):
    path = _jsonl(tmp_path, json.dumps({"question": "q", "answer": "no marker"}))
    with pytest.raises(DatasetError, match="####"):
        load_prompt_dataset(path, format="gsm8k")
    path = _jsonl(tmp_path, json.dumps({"prompt": [{"role": "user", "content": "q"}],
                                        "reward_model": {"style": "rule"}}))  # fmt: skip
    with pytest.raises(DatasetError, match=r"reward_model\.ground_truth") as e:
        load_prompt_dataset(path, format="dapo_math")
    assert e.value.where == "bad.jsonl:1"
    rows = [{"prompt": "q", "answer": "1"}]
    bad_parquet = tmp_path / "bad.parquet"
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist([*rows, {"prompt": "", "answer": "2"}]), bad_parquet)
    with pytest.raises(DatasetError, match=r"bad.parquet\[1\], field 'prompt': empty prompt"):
        load_prompt_dataset(bad_parquet)


def test_unknown_format_and_missing_file(tmp_path):
    with pytest.raises(ValueError, match="valid"):
        load_prompt_dataset(FIXTURES / "gsm8k_sample.jsonl", format="gsm9k")
    with pytest.raises(FileNotFoundError):
        load_prompt_dataset(tmp_path / "nope.jsonl")


def test_render_with_chat_template(tokenizer):
    ex = PromptExample(answer="2", prompt="What is {x}? \\boxed{} it.", source="t:1")
    text = render_prompt(ex, tokenizer, template="Q: {question}\nA:", system_prompt="Be brief.")
    assert text == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nQ: What is {x}? \\boxed{} it.\nA:<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_render_messages_and_plain_tokenizer(tokenizer):
    ex = PromptExample(answer="2", messages=[{"role": "user", "content": "1+1?"}])
    assert render_prompt(ex, tokenizer).endswith("1+1?<|im_end|>\n<|im_start|>assistant\n")

    class Plain:  # a tokenizer without a chat template: contents joined by newlines
        chat_template = None

    assert render_prompt(ex, Plain(), system_prompt="S") == "S\n1+1?\n"
    own_system = PromptExample(
        answer="2", messages=[{"role": "system", "content": "x"}, {"role": "user", "content": "q"}]
    )
    with pytest.raises(ValueError, match="own system message"):
        render_prompt(own_system, tokenizer, system_prompt="S")
    with pytest.raises(ValueError, match=r"\{question\}"):
        render_prompt(PromptExample(answer="1", prompt="q"), tokenizer, template="no field")


def test_tiny_gsm8k_config_wires_data_to_the_math_reward(monkeypatch, tokenizer):
    from rlvr.config.load import load_config
    from rlvr.rewards import make_reward

    monkeypatch.chdir(ROOT)
    cfg = load_config(ROOT / "configs" / "gsm8k_tiny.yaml")
    d = cfg.data
    rows = load_prompt_dataset(
        d.eval_path, format=d.format, prompt_field=d.prompt_field, answer_field=d.answer_field
    )
    prompts = [render_prompt(r, tokenizer, template=d.prompt_template) for r in rows]
    assert all(p.endswith("Answer in <answer></answer>.<|im_end|>\n<|im_start|>assistant\n")
               for p in prompts)  # fmt: skip
    math = make_reward(cfg.reward.accuracy)
    right = [f"<answer>{r.answer}</answer>" for r in rows]
    wrong = [f"<answer>{int(r.answer) + 1}</answer>" for r in rows]
    answers = [r.answer for r in rows]
    assert math(prompts=prompts, completions=right, answer=answers) == [1.0] * len(rows)
    assert math(prompts=prompts, completions=wrong, answer=answers) == [0.0] * len(rows)


def test_gpu_example_config_loads_once_the_data_exist(monkeypatch, tmp_path):
    from rlvr.config.load import load_config

    (tmp_path / "data").mkdir()
    for split in ("train", "test"):
        (tmp_path / "data" / f"gsm8k_{split}.jsonl").write_text(
            json.dumps({"question": "1+1?", "answer": "#### 2"}) + "\n"
        )
    monkeypatch.chdir(tmp_path)
    cfg = load_config(ROOT / "configs" / "qwen2.5-0.5b-gsm8k-dapo.yaml")
    assert cfg.model.name_or_path == "Qwen/Qwen2.5-0.5B-Instruct"
    assert (cfg.algo.clip_high, cfg.algo.agg, cfg.algo.dynamic_sampling) == (
        0.28,
        "token_mean",
        True,
    )
    assert cfg.data.format == "gsm8k" and cfg.reward.accuracy == "math"


GOOD_LINE = b'{"prompt": "1+1?", "answer": "2"}\n'


def test_utf8_bom_at_the_start_is_accepted(tmp_path):
    path = tmp_path / "bom.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + GOOD_LINE + GOOD_LINE)
    rows = load_prompt_dataset(path)
    assert [r.prompt for r in rows] == ["1+1?", "1+1?"]


@pytest.mark.parametrize(
    "suffix, data, where, message",
    [
        (
            ".jsonl",
            GOOD_LINE + b'{"prompt": "caf\xe9", "answer": "2"}\n',
            "bad.jsonl:2",
            "byte 0xe9 at column 16",
        ),
        (".jsonl", GOOD_LINE + GOOD_LINE + b"\xff\xfe\n", "bad.jsonl:3", "byte 0xff at column 1"),
        (
            ".json",
            b'[\n {"prompt": "a", "answer": "1"},\n {"prompt": "\x80"}]',
            "bad.json:3",
            "byte 0x80 at column 14",
        ),
        (
            ".jsonl",
            "\ufeff".encode("utf-16-le") + GOOD_LINE.decode().encode("utf-16-le"),
            "bad.jsonl:1",
            "the file is UTF-16",
        ),
    ],
)
def test_invalid_utf8_names_file_and_line(tmp_path, suffix, data, where, message):
    path = tmp_path / f"bad{suffix}"
    path.write_bytes(data)
    with pytest.raises(DatasetError) as e:
        load_prompt_dataset(path)
    assert str(e.value).startswith(where + ":"), str(e.value)
    assert message in str(e.value)


def test_lone_surrogate_names_line_and_field(tmp_path):
    path = tmp_path / "sur.jsonl"
    path.write_bytes(GOOD_LINE + b'{"prompt": "x \\ud800 y", "answer": "2"}\n')
    with pytest.raises(DatasetError, match=r"sur\.jsonl:2, field 'prompt': holds a lone surrogate"):
        load_prompt_dataset(path)
    paired = tmp_path / "pair.jsonl"  # an escaped pair is one character (U+1F600): fine
    paired.write_bytes(b'{"prompt": "x \\ud83d\\ude00", "answer": "2"}\n')
    assert load_prompt_dataset(paired)[0].prompt == "x \U0001f600"


def test_line_separators_inside_strings_stay_in_their_line(tmp_path):
    path = tmp_path / "ls.jsonl"
    path.write_bytes(
        GOOD_LINE + '{"prompt": "a\u2028b\x85c", "answer": "2"}\n'.encode() + GOOD_LINE
    )
    rows = load_prompt_dataset(path)
    assert rows[1].prompt == "a\u2028b\x85c" and rows[2].source == "ls.jsonl:3"


def test_cli_reports_bad_bytes_as_one_error_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_bytes(GOOD_LINE + b'{"prompt": "\xc3\x28", "answer": "2"}\n')
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "rlvr",
            "train",
            f"--data.path={path}",
            "--max-steps=1",
            f"--output-dir={tmp_path / 'run'}",
            "--no-progress",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 2, res.stderr
    assert "Traceback" not in res.stderr
    assert "error: bad.jsonl:2: not valid UTF-8 (byte 0xc3 at column 13)" in res.stderr
