"""A TRL script's parts through rlvr.train: prompt-only datasets (every column reaches the
rewards, a reward that needs the reference is refused by name), `args=` of GRPOConfig names,
`processing_class=`, `peft_config=` with "all-linear", TrainerCallback objects, and a run
whose reward lives in a module beside the script resuming and evaluating from the CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import rlvr
from rlvr.config.schema import ConfigError
from rlvr.data.dataset import load_prompt_dataset
from rlvr.data.errors import DatasetError
from rlvr.run.callbacks import CallbackError

SMALL = {"train.eval_size": 0, "rollout.max_new_tokens": 12}
ARGS = {"num_generations": 4, "per_device_train_batch_size": 8, "max_steps": 2, "beta": 0.0}


def prompt_rows(n: int) -> list[dict]:
    return [{"prompt": f"Compute {a}+{a + 3}. Answer in <answer></answer>.", "topic": f"t{a}"}
            for a in range(10, 10 + n)]  # fmt: skip


def reward_len(completions, **kwargs):
    return [-abs(20 - len(c)) for c in completions]


def test_prompt_only_rows_load_without_an_answer(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text('{"prompt": "q1", "topic": "a"}\n{"prompt": "q2", "topic": "b"}\n')
    rows = load_prompt_dataset(path)
    assert [(r.prompt, r.answer, r.columns) for r in rows] == [
        ("q1", None, {"topic": "a"}), ("q2", None, {"topic": "b"})]  # fmt: skip
    path.write_text('{"prompt": "q1"}\n{"prompt": "q2", "answer": "3"}\n')
    with pytest.raises(DatasetError, match=r"p\.jsonl:2, field 'answer': present, but the first"):
        load_prompt_dataset(path)
    path.write_text('{"prompt": "q1"}\n')  # an answer column named explicitly must be there
    with pytest.raises(DatasetError, match=r"field 'ref': missing"):
        load_prompt_dataset(path, answer_field="ref")


def test_prompt_only_columns_reach_rewards_and_a_reference_reward_is_named(tmp_path):
    seen = []

    def reward(completions, **kwargs):
        seen.append((sorted(kwargs), kwargs["topic"][:1]))
        return [0.0] * len(completions)

    rlvr.train(reward_funcs=reward, train_dataset=prompt_rows(8), preset="grpo", args=ARGS,
               config={**SMALL, "train.max_steps": 1}, output_dir=tmp_path / "a",
               show_progress=False)  # fmt: skip
    names, topic = seen[0]
    assert "answer" not in names and "topic" in names and topic[0].startswith("t1")

    def needs_answer(completions, answer, **kwargs):
        return [0.0] * len(completions)

    for fn, name in ((needs_answer, "needs_answer"), ("math", "math")):
        with pytest.raises(ConfigError, match=rf"reward '{name}' needs the reference answer") as e:
            rlvr.train(reward_funcs=fn, train_dataset=prompt_rows(8), args=ARGS, config=SMALL,
                       output_dir=tmp_path / name, show_progress=False)  # fmt: skip
        assert "data.answer_field=COLUMN" in str(e.value) and "\n" not in str(e.value)


class Recorder:
    """A transformers.TrainerCallback (subclassed in the test) that records its events."""

    def __init__(self):
        self.events = []

    def on_train_begin(self, args, state, control, **kw):
        self.events.append(("begin", state.global_step, args.output_dir, sorted(kw)))

    def on_step_end(self, args, state, control, **kw):
        self.events.append(("step", state.global_step, state.max_steps))
        if state.global_step == 2:
            control.should_training_stop = True

    def on_log(self, args, state, control, logs=None, **kw):
        self.events.append(("log", state.global_step, "reward/mean" in logs))

    def on_save(self, args, state, control, **kw):
        self.events.append(("save", state.global_step))

    def on_train_end(self, args, state, control, **kw):
        self.events.append(("end", state.global_step, len(state.log_history)))


def test_trainer_callbacks_processing_class_and_named_callback_errors(tmp_path):
    from transformers import TrainerCallback

    from rlvr.models import load_tokenizer

    class Stop(Recorder, TrainerCallback):
        pass

    cb = Stop()
    tok = load_tokenizer("rlvr-tiny")
    result = rlvr.train(reward_funcs=reward_len, train_dataset=prompt_rows(8), preset="grpo",
                        args={**ARGS, "max_steps": 4, "logging_steps": 2}, config=SMALL,
                        callbacks=[cb], processing_class=tok, output_dir=tmp_path / "run",
                        show_progress=False)  # fmt: skip
    run = str((tmp_path / "run").resolve())
    objects = ["lr_scheduler", "model", "optimizer", "processing_class"]
    assert cb.events == [("begin", 0, run, objects), ("step", 1, 4), ("step", 2, 4),
                         ("log", 2, True), ("save", 2), ("end", 2, 1)]  # fmt: skip
    assert [m["step"] for m in result.metrics] == [1, 2]  # should_training_stop after step 2

    class Broken(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            raise ValueError("boom")

    def plain(step, metrics):
        raise KeyError("nope")

    for callback, match in ((Broken(), r"callback Broken\.on_step_end failed at step 1: "
                             r"ValueError: boom"),
                            (plain, r"callback .*plain failed at step 1: KeyError: 'nope'")):  # fmt: skip
        with pytest.raises(CallbackError, match=match) as e:
            rlvr.train(reward_funcs=reward_len, train_dataset=prompt_rows(8), preset="grpo",
                       args=ARGS, config=SMALL, callbacks=[callback],
                       output_dir=tmp_path / f"b{len(match)}", show_progress=False)  # fmt: skip
        assert "\n" not in str(e.value) and e.value.__cause__ is None
    with pytest.raises(ConfigError, match="neither fn"):
        rlvr.Trainer(reward_funcs=reward_len, callbacks=[3])


def test_peft_config_all_linear_adapts_every_linear_layer_but_the_head(tmp_path):
    peft = pytest.importorskip("peft")
    import torch

    from rlvr.models import load_model

    base = load_model("rlvr-tiny")
    linear = {n.rsplit(".", 1)[-1] for n, m in base.named_modules()
              if isinstance(m, torch.nn.Linear)}  # fmt: skip
    assert "lm_head" in linear
    result = rlvr.train(reward_funcs=reward_len, train_dataset=prompt_rows(8), preset="grpo",
                        args={**ARGS, "max_steps": 1}, config=SMALL,
                        peft_config=peft.LoraConfig(r=2, lora_alpha=4, target_modules="all-linear"),
                        output_dir=tmp_path / "lora", show_progress=False)  # fmt: skip
    adapted = {n.rsplit(".", 1)[-1] for n, m in result.model.named_modules()
               if hasattr(m, "lora_A") and len(m.lora_A)}  # fmt: skip
    assert adapted == linear - {"lm_head"}
    stored = (result.run_dir / "config.yaml").read_text()
    assert "lora_rank: 2" in stored and "- all-linear" in stored


SCRIPT = """
import sys
import rlvr
from common import reward_len

rows = [{"prompt": f"Compute {a}+{a + 3}. Answer in <answer></answer>."} for a in range(10, 30)]
rlvr.train(reward_funcs=reward_len, train_dataset=rows, eval_dataset=rows[:4], preset="grpo",
           args={"num_generations": 4, "per_device_train_batch_size": 8, "max_steps": 1,
                 "beta": 0.0, "max_completion_length": 12},
           config={"train.eval_size": 4}, output_dir=sys.argv[1], show_progress=False)
"""


@pytest.mark.slow
def test_a_run_started_from_python_resumes_and_evaluates_from_the_cli(tmp_path):
    project, elsewhere, run = tmp_path / "project", tmp_path / "elsewhere", tmp_path / "run"
    project.mkdir(), elsewhere.mkdir()
    (project / "common.py").write_text(
        "def reward_len(completions, **kwargs):\n"
        "    return [-abs(20 - len(c)) for c in completions]\n"
    )
    (project / "script.py").write_text(textwrap.dedent(SCRIPT))
    env = {**os.environ, "PYTHONPATH": str(Path(rlvr.__file__).parents[1])}
    for cmd, cwd in (
        ([sys.executable, "script.py", str(run)], project),
        ([sys.executable, "-m", "rlvr", "train", "--resume", str(run), "--max-steps", "2",
          "--no-progress", "--trust-run-code"], elsewhere),
        ([sys.executable, "-m", "rlvr", "eval", "--model", str(run), "--num-prompts", "2",
          "--k", "1", "--trust-run-code"], elsewhere),
    ):  # fmt: skip
        out = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
        assert out.returncode == 0, out.stderr[-2000:]
    assert "python_path:\n  - " + str(project.resolve()) in (run / "config.yaml").read_text()
    assert [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines()] == [
        1,
        2,
    ]
    assert json.loads(out.stdout)["num_prompts"] == 2


def test_python_path_reaches_the_isolated_reward_worker(tmp_path, monkeypatch):
    from rlvr.config.callables import extend_sys_path
    from rlvr.rewards.limits import ProcessReward

    (tmp_path / "beside_the_script.py").write_text(
        "def brevity(completions, **kwargs):\n    return [-len(c) for c in completions]\n"
    )
    monkeypatch.setattr(sys, "path", list(sys.path))
    extend_sys_path([str(tmp_path)])
    assert sys.path[0] == str(tmp_path)
    spec = "beside_the_script:brevity"
    with_path = ProcessReward(spec, {}, "brevity", 60.0, (str(tmp_path),))
    assert with_path(completions=["ab", "abcd"]) == [-2, -4]
    with_path.kill()
    without = ProcessReward(spec, {}, "brevity", 60.0)  # the worker cannot import it
    with pytest.raises(RuntimeError, match="the worker process died"):
        without(completions=["ab"])
    without.kill()
