"""The practitioner's CLI workflow: override values with spaces, one-line dataset and reward
errors, resume from another directory, `rlvr eval` on a run, a dataset and a LoRA checkpoint."""

from __future__ import annotations

import json
import random
import re

import pytest
import yaml

from rlvr.cli.arguments import split_overrides
from rlvr.cli.main import main

SMALL = [
    "--rollout.prompts_per_step=2",
    "--rollout.group_size=4",
    "--rollout.max_new_tokens=24",
    "--algo.overlong_cache=4",
    "--train.eval_size=4",
    "--no-progress",
]


def _data(path, n=20, seed=0):
    r = random.Random(seed)
    rows = []
    for _ in range(n):
        a, b = r.randint(10, 99), r.randint(10, 99)
        rows.append({"question": f"Compute {a}+{b}.", "answer": str(a + b)})
    path.write_text("".join(json.dumps(x) + "\n" for x in rows))
    return path


def test_split_overrides_keeps_values_with_spaces():
    argv = ["cfg.yaml", "--data.prompt_template={question} Answer now.", "--max-steps", "3",
            "--reward.params={math: {signed: false}}", "--resume", "a.b"]  # fmt: skip
    overrides, rest = split_overrides(argv)
    assert overrides == [argv[1], argv[4]]
    assert rest == ["cfg.yaml", "--max-steps", "3", "--resume", "a.b"]


def test_values_with_spaces_and_a_dataset_error_in_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "bad.jsonl").write_text(json.dumps({"question": "q", "answer": "1 #### 1"}) + "\n")
    args = ["--data.path=bad.jsonl", "--reward.accuracy=math", "--output-dir", "run",
            "--data.prompt_template={question} Answer now.",
            "--reward.params={math: {signed: false}}", *SMALL]  # fmt: skip
    rc = main(["train", *args])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2
    assert err[-1].startswith("error: bad.jsonl:1, field 'prompt': missing")
    assert "--data.prompt_field=question" in err[-1] and "--data.format=gsm8k" in err[-1]
    assert not any("Traceback" in line for line in err)
    assert not (tmp_path / "run").exists()  # a run that never started leaves nothing
    assert main(["config", "show", *args]) == 0  # the config that run would have stored
    stored = yaml.safe_load(capsys.readouterr().out)
    assert stored["data"]["prompt_template"] == "{question} Answer now."
    assert stored["reward"]["params"] == {"math": {"signed": False}}
    assert stored["data"]["path"] == str(tmp_path / "bad.jsonl")  # absolute


@pytest.mark.parametrize("on_error", ["raise", "zero"])
def test_a_reward_that_exits_is_a_named_failure(tmp_path, capsys, monkeypatch, on_error):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "r.py").write_text("def acc(completions, **kwargs):\n    raise SystemExit(0)\n")
    rc = main(
        ["train", "--reward.accuracy=r.py:acc", f"--reward.on_error={on_error}",
         "--output-dir", "run", "--max-steps", "1", "--train.eval_size=0", *SMALL[:-2]]
    )  # fmt: skip
    err = capsys.readouterr().err
    if on_error == "raise":
        assert rc == 1
        assert "error: reward 'acc' failed on sample 0 (SystemExit: 0)" in err
    else:
        assert rc == 0
        assert re.search(r"reward 'acc' failed on (\d+) of \1 responses", err)
        assert "reward failures over the run" in err


def test_a_step_with_nothing_to_train_on_says_why(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "r.py").write_text(
        "def solved(completions, **kwargs):\n    return [1.0] * len(completions)\n"
    )
    rc = main(
        ["train", "--reward.accuracy=r.py:solved", "--output-dir", "run", "--max-steps", "1",
         "--train.eval_size=0", "--algo.max_gen_batches=1", *SMALL[:-2]]
    )  # fmt: skip
    assert rc == 0
    err = capsys.readouterr().err
    assert "step 1: no update, nothing to train on: every group was solved" in err
    assert re.search(r"^step 1/1  reward \S+  acc 1\.000  no update \(all_solved\)", err, re.M)
    row = json.loads((tmp_path / "run" / "metrics.jsonl").read_text())
    assert row["update/skipped"] == 1.0 and row["update/skip_reason"] == "all_solved"


def test_resume_from_another_directory_then_eval_the_run(tmp_path, capsys, monkeypatch):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    monkeypatch.chdir(a)
    _data(a / "data.jsonl")
    args = ["--data.path=data.jsonl", "--data.prompt_field=question", "--reward.accuracy=math",
            "--data.prompt_template={question} Answer in <answer></answer>.", *SMALL]  # fmt: skip
    assert main(["train", "--output-dir", "run", "--max-steps", "1", *args]) == 0
    monkeypatch.chdir(b)
    assert main(["train", "--resume", str(a / "run"), "--max-steps", "2", "--no-progress"]) == 0
    steps = [json.loads(x)["step"] for x in (a / "run" / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2]
    capsys.readouterr()
    rc = main(["eval", "--model", str(a / "run"), "--k", "2", "--num-prompts", "4",
               "--output", "out.jsonl", "--per-problem", "problems.jsonl"])  # fmt: skip
    assert rc == 0
    result = json.loads(capsys.readouterr().out)
    assert result["model"].endswith("step-000002") and result["num_prompts"] == 4
    assert {"avg@2", "pass@1", "pass@2", "greedy_accuracy"} <= set(result)
    assert result["pass@1"] == pytest.approx(result["avg@2"])  # unbiased pass@1 = mean accuracy
    problems = [json.loads(x) for x in (b / "problems.jsonl").read_text().splitlines()]
    assert [p["n"] for p in problems] == [2] * 4
    lines = [json.loads(x) for x in (b / "out.jsonl").read_text().splitlines()]
    assert len(lines) == 4 + 4 * 2  # greedy once, sampled k times
    assert {"prompt", "completion", "answer", "reward", "correct"} <= set(lines[0])


def test_eval_a_lora_checkpoint_on_a_dataset(tmp_path, capsys, monkeypatch):
    pytest.importorskip("peft")
    monkeypatch.chdir(tmp_path)
    _data(tmp_path / "d.jsonl")
    assert main(["train", "--output-dir", "run", "--max-steps", "1", "--model.lora_rank=4",
                 "--train.eval_size=0", *SMALL[:-2]]) == 0  # fmt: skip
    ckpt = next((tmp_path / "run" / "checkpoints").iterdir())
    assert (ckpt / "adapter_config.json").is_file()
    capsys.readouterr()
    rc = main(["eval", "--model", str(ckpt), "--k", "2", "--data.path=d.jsonl",
               "--data.prompt_field=question", "--reward.accuracy=math", "--num-prompts", "3"])  # fmt: skip
    assert rc == 0
    result = json.loads(capsys.readouterr().out)
    assert result["num_prompts"] == 3 and result["data"].endswith("d.jsonl")
