"""reasoning-gym's tasks as data (`data.task=reasoning_gym`): rows load, reasoning-gym's own
`score_answer` is the accuracy reward, over-long prompts are dropped and counted by task name,
and a short run and `rlvr eval` complete on them."""

import json

import pytest

pytest.importorskip("reasoning_gym")

import torch

from rlvr.cli.main import main
from rlvr.config import load_config
from rlvr.config.schema import ConfigError
from rlvr.data.prompts import dropped_note, load_prompts
from rlvr.rewards.scoring import Scorer
from rlvr.rollout import Rollout
from rlvr.tasks.reasoning_gym import ReasoningGymTask

TASKS = "basic_arithmetic,chain_sum,leg_counting"


def _cfg(*extra):
    return load_config(
        None,
        [
            "--data.task=reasoning_gym",
            f"--data.reasoning_gym.tasks={TASKS}",
            "--data.reasoning_gym.size=6",
            "--train.eval_size=6",
            "--rollout.prompts_per_step=2",
            *extra,
        ],
    )


def _rollout(n):
    return Rollout(
        prompt_ids=[[1]] * n,
        completion_ids=torch.ones(n, 2, dtype=torch.long),
        lengths=torch.full((n,), 2),
        truncated=torch.zeros(n, dtype=torch.bool),
        group_size=1,
    )


def test_three_tasks_load_and_score_reference_one_wrong_zero(tokenizer):
    cfg = _cfg("--data.reasoning_gym.system_prompt=none")
    source = load_prompts(cfg, tokenizer, max_context=None)
    task = source.task
    assert isinstance(task, ReasoningGymTask)
    assert len(source.train) == 18 and {p.example.meta["task"] for p in source.train} == {
        "basic_arithmetic",
        "chain_sum",
        "leg_counting",
    }
    # interleaved task by task; held-out questions are not training questions
    assert [p.example.meta["task"] for p in source.train[:3]] == [
        "basic_arithmetic",
        "chain_sum",
        "leg_counting",
    ]
    train_q = {p.example.question for p in source.train}
    assert source.eval and not train_q & {p.example.question for p in source.eval}
    assert "system" not in source.train[0].text  # system_prompt none: the question alone
    scorer = Scorer.build(cfg, task)
    rows = source.train[:3] + source.train[:3]
    completions = [task.reference_completion(p.example) for p in source.train[:3]] + [
        "<answer>not the answer</answer>"
    ] * 3
    assert [task.score(c, p.example) for p, c in zip(rows, completions)] == [1, 1, 1, 0, 0, 0]
    scores = scorer(rows, completions, _rollout(6))
    r = cfg.reward  # the dapo preset scores a wrong answer -1
    assert scores.terms["accuracy"].tolist() == [r.correct_score] * 3 + [r.wrong_score] * 3
    assert scores.correct.tolist() == [True, True, True, False, False, False]


def test_default_system_prompt_is_reasoning_gyms(tokenizer):
    from reasoning_gym.utils import SYSTEM_PROMPTS

    source = load_prompts(_cfg(), tokenizer, max_context=None)
    assert SYSTEM_PROMPTS["default"].strip()[:40] in source.train[0].text


def test_over_long_prompts_are_dropped_and_counted_by_task(tokenizer):
    cfg = _cfg("--rollout.max_new_tokens=16")
    full = load_prompts(cfg, tokenizer, max_context=None)
    lengths = sorted(len(p.ids) for p in full.train)
    context = lengths[len(lengths) // 2] + 16  # about half the prompts fit
    source = load_prompts(cfg, tokenizer, max_context=context)
    assert all(len(p.ids) <= context - 16 for p in source.train + source.eval)
    train_only = load_prompts(
        _cfg("--rollout.max_new_tokens=16", "--train.eval_size=0"), tokenizer, max_context=context
    )
    dropped = sum(len(p.ids) > context - 16 for p in full.train)
    assert len(train_only.train) == len(full.train) - dropped
    assert sum(train_only.dropped.values()) == dropped > 0
    # the held-out rows are read until train.eval_size fit: the drops among them add up too
    assert len(source.eval) == 6 and sum(source.dropped.values()) >= dropped
    assert set(train_only.dropped) <= {"basic_arithmetic", "chain_sum", "leg_counting"}
    assert dropped_note(train_only).startswith(f"data: dropped {dropped} prompts longer")
    with pytest.raises(ConfigError, match=r"data\.reasoning_gym\.tasks: every training prompt"):
        load_prompts(cfg, tokenizer, max_context=lengths[0] + 15)


def test_unknown_task_is_refused_by_name(tokenizer):
    with pytest.raises(ConfigError, match=r"data\.reasoning_gym\.tasks: 'basic_arithmetik'"):
        load_prompts(_cfg("--data.reasoning_gym.tasks=basic_arithmetik"), tokenizer, None)
    with pytest.raises(ConfigError, match=r"data\.reasoning_gym\.size"):
        _cfg("--data.reasoning_gym.size=0")


def test_short_run_and_eval_with_system_prompt_none(tiny_model_dir, tmp_path, capsys):
    run = tmp_path / "run"
    common = [
        "--data.task=reasoning_gym",
        "--data.reasoning_gym.tasks=basic_arithmetic,chain_sum",
        "--data.reasoning_gym.system_prompt=none",
        "--data.reasoning_gym.size=8",
    ]
    rc = main(
        [
            "train",
            f"--model.name_or_path={tiny_model_dir}",
            *common,
            "--rollout.prompts_per_step=2",
            "--rollout.group_size=2",
            "--rollout.max_new_tokens=12",
            "--train.eval_size=4",
            "--max-steps",
            "2",
            "--output-dir",
            str(run),
            "--no-progress",
        ]
    )
    assert rc == 0
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert any("accuracy" in r for r in rows)
    capsys.readouterr()
    rc = main(
        [
            "eval",
            "--model",
            str(run),
            *common,
            "--k",
            "2",
            "--num-prompts",
            "4",
            "--max-new-tokens",
            "12",
        ]
    )
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert out["num_prompts"] == 4 and out["data"].startswith("reasoning_gym:")
