"""The Python API: rlvr.train / rlvr.Trainer with TRL-style rewards on in-memory data, model
objects, callbacks, named errors, resume; and `rlvr.train`, the function, apart from the loop's package `rlvr.training`."""

from __future__ import annotations

import inspect
import json
import random
import re
import subprocess
import sys

import pytest

import rlvr
from rlvr.config.schema import ConfigError
from rlvr.data.errors import DatasetError

SMALL = {
    "train.max_steps": 2,
    "rollout.prompts_per_step": 2,
    "rollout.group_size": 4,
    "rollout.max_new_tokens": 24,
    "algo.overlong_cache": 4,
    "train.eval_size": 4,
}


def rows(n: int, seed: int) -> list[dict]:
    """Arithmetic in the built-in model's prompt format, as a user's own list of dicts."""
    r = random.Random(seed)
    out = []
    for _ in range(n):
        a, b = r.randint(10, 99), r.randint(10, 99)
        out.append({"prompt": f"Compute {a}+{b}. Answer in <answer></answer>.", "answer": a + b})
    return out


def exact_answer(completions, answer, **kwargs):
    """A reward written for TRL's GRPOTrainer: completions and a dataset column by name."""
    out = []
    for completion, ref in zip(completions, answer):
        m = re.search(r"<answer>(.*?)</answer>", completion)
        out.append(1.0 if m and m.group(1).strip() == str(ref) else 0.0)
    return out


def test_one_name_one_thing_in_a_fresh_interpreter():
    """`rlvr.train` is the API function, whatever was imported first; the training loop is the
    package `rlvr.training`, and no module has its class swapped."""
    code = (
        "import rlvr.training.update, inspect, types\n"
        "from rlvr.training.trainer import train as loop\n"
        "import rlvr\n"
        "from rlvr import train\n"
        "from rlvr.api import train as api_train\n"
        "assert inspect.isfunction(rlvr.train) and train is api_train and train is not loop\n"
        "assert rlvr.training.update.policy_update\n"
        "assert type(rlvr.training) is types.ModuleType\n"
        "assert list(inspect.signature(rlvr.train).parameters)[:3] == "
        "['model', 'reward_funcs', 'reward_weights']\n"
        "assert 'TrainResult' in rlvr.train.__doc__\n"
        "assert rlvr.Trainer and rlvr.TrainResult\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def test_importing_the_loop_leaves_the_function_in_process():
    import rlvr.training.trainer

    assert inspect.isfunction(rlvr.train)
    assert "reward_funcs" in inspect.signature(rlvr.train).parameters


def test_train_with_trl_reward_on_list_of_dicts(tmp_path):
    steps = []
    result = rlvr.train(
        model="rlvr-tiny",
        reward_funcs=[exact_answer, "format"],
        reward_weights=[1.0, 0.0],
        train_dataset=rows(40, 1),
        eval_dataset=rows(4, 2),
        config={**SMALL, "train.max_steps": 3},
        callbacks=[lambda step, metrics: steps.append((step, "accuracy" in metrics))],
        output_dir=tmp_path / "run",
        show_progress=False,
    )
    assert result.run_dir == (tmp_path / "run").resolve()
    assert steps == [(1, True), (2, True), (3, True)]
    assert [m["step"] for m in result.metrics] == [1, 2, 3]
    assert "reward/format" in result.metrics[0]
    assert result.summary["steps"] == 3 and "accuracy" in result.summary["eval_after"]
    assert result.model is not None and hasattr(result.model, "generate")
    stored = (result.run_dir / "config.yaml").read_text()
    assert "exact_answer=" not in stored and "accuracy: test_api:exact_answer" in stored
    assert (result.run_dir / "data" / "train.jsonl").is_file()


def test_callback_stop_and_trainer_object_with_a_model_object(tmp_path, tiny_model_dir):
    from rlvr.models import load_model, load_tokenizer

    model, tok = load_model(str(tiny_model_dir)), load_tokenizer(str(tiny_model_dir))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    trainer = rlvr.Trainer(
        model=model,
        tokenizer=tok,
        reward_funcs=lambda completions, **kw: [float(len(set(c))) for c in completions],
        train_dataset=rows(16, 3),
        config={"rollout": {"prompts_per_step": 2, "group_size": 4, "max_new_tokens": 8},
                "algo": {"overlong_cache": 2, "dynamic_sampling": False,
                         "overlong_filter": False},
                "train": {"max_steps": 5, "eval_size": 0}, "optim.lr": 1e-2},
        callbacks=[lambda step, metrics: "stop" if step == 2 else None],
        output_dir=tmp_path / "run",
        show_progress=False,
    )  # fmt: skip
    result = trainer.train()
    assert [m["step"] for m in result.metrics] == [1, 2]  # stopped by the callback
    assert result.model is model  # trained in place
    assert any(not torch_equal(before[k], v) for k, v in model.state_dict().items())
    stored = (result.run_dir / "config.yaml").read_text()
    assert "accuracy: none" in stored and "- _lambda_=1.0" in stored  # no name says correct


def torch_equal(a, b) -> bool:
    import torch

    return torch.equal(a, b)


def test_resume_continues_and_refuses_changes_to_the_math(tmp_path):
    kwargs = dict(
        reward_funcs=[exact_answer],
        train_dataset=rows(20, 4),
        config=SMALL,
        output_dir=tmp_path / "run",
        show_progress=False,
    )
    rlvr.train(**kwargs)
    with pytest.raises(ConfigError, match="already holds a run"):
        rlvr.train(**kwargs)
    with pytest.raises(ConfigError, match=r"cannot change optim\.lr"):
        rlvr.train(**{**kwargs, "config": {**SMALL, "optim.lr": 1e-3}}, resume_from_checkpoint=True)
    with pytest.raises(ConfigError, match="differs from the rows"):
        rlvr.train(**{**kwargs, "train_dataset": rows(20, 5)}, resume_from_checkpoint=True)
    more = rlvr.train(
        **{**kwargs, "config": {**SMALL, "train.max_steps": 3}}, resume_from_checkpoint=True
    )
    assert [m["step"] for m in more.metrics] == [1, 2, 3]


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"reward_funcs": [exact_answer], "reward_weights": [1, 2]}, ConfigError,
         "2 weights for 1 reward_funcs"),
        ({"train_dataset": [{"prompt": "q", "answer": 1}, {"question": "q", "answer": 2}]},
         DatasetError, r"train_dataset\[1\], field 'prompt': missing"),
        ({"train_dataset": [{"prompt": "q", "answer": 1, "truncated": True}]},
         DatasetError, r"train_dataset\[0\], field 'truncated'.*Reserved names"),
        ({"train_dataset": [{"prompt": "q", "answer": {1}}]}, DatasetError,
         r"train_dataset\[0\]: .*set"),
        ({"config": {"algo.agg": "mean"}}, ConfigError, "algo.agg: got 'mean'"),
        ({"config": {"nope": 1}}, ConfigError, "neither 'section.key'"),
        ({"reward_funcs": [3]}, ConfigError, "neither a reward name nor callable"),
        ({"callbacks": [1]}, ConfigError, "neither fn.step, metrics. nor a transformers"),
    ],
)  # fmt: skip
def test_named_errors_before_any_work(tmp_path, kwargs, error, match):
    kwargs = {"reward_funcs": [exact_answer], "train_dataset": rows(4, 0), **kwargs}
    with pytest.raises(error, match=match):
        rlvr.train(output_dir=tmp_path / "run", show_progress=False, **kwargs)


def test_config_object_and_nested_dicts_layer_like_the_cli(tmp_path):
    from rlvr.config.load import load_config

    base = load_config(None, {"rollout": {"group_size": 4}}, preset="grpo")
    trainer = rlvr.Trainer(config=base, reward_funcs=["math"], train_dataset=rows(4, 0))
    cfg = trainer._build(None)
    assert cfg.preset == "grpo" and cfg.rollout.group_size == 4 and cfg.algo.kl_coef == 0.04
    assert cfg.reward.accuracy == "math"
    nested = rlvr.Trainer(
        config={"rollout": {"group_size": 6}, "algo.clip_high": 0.3}, train_dataset=rows(4, 0),
        reward_funcs="math", output_dir=tmp_path / "x",
    )._build(None)  # fmt: skip
    assert nested.rollout.group_size == 6 and nested.algo.clip_high == 0.3


def test_datasets_dataset_and_a_path_are_accepted(tmp_path, monkeypatch):
    datasets = pytest.importorskip("datasets")
    data = rows(6, 7)
    cfg = rlvr.Trainer(
        reward_funcs="math", train_dataset=datasets.Dataset.from_list(data),
        output_dir=tmp_path / "a",
    )._build(None)  # fmt: skip
    path = tmp_path / "a" / "data" / "train.jsonl"
    written = [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines()]
    assert written == data and cfg.data.path == str(path)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mine.jsonl").write_text("".join(json.dumps(r) + "\n" for r in data))
    cfg = rlvr.Trainer(
        reward_funcs="math", train_dataset="mine.jsonl", eval_dataset="mine.jsonl",
        output_dir="b",
    )._build(None)  # fmt: skip
    assert cfg.data.path == cfg.data.eval_path == str(tmp_path / "mine.jsonl")  # absolute
    assert cfg.train.output_dir == str(tmp_path / "b")
