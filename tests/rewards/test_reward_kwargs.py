"""What the Scorer passes to reward functions (TRL's keyword arguments plus rlvr's), the
reserved column names refused at load, and "correct" under a user accuracy reward."""

from __future__ import annotations

import json

import pytest
import torch

from rlvr.config.load import load_config
from rlvr.data.errors import DatasetError
from rlvr.data.prompts import load_prompts
from rlvr.rewards import RESERVED_KWARGS
from rlvr.rewards.scoring import Scorer
from rlvr.rollout import Rollout

SEEN: list[dict] = []


def recording(prompts, completions, completion_ids, **kwargs):
    SEEN.append(dict(prompts=prompts, completions=completions, ids=completion_ids, **kwargs))
    return [float(len(c if isinstance(c, str) else c[0]["content"])) for c in completions]


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _rollout(n: int, G: int) -> Rollout:
    return Rollout(
        prompt_ids=[[5]] * n,
        completion_ids=torch.arange(n * 3).view(n, 3),
        lengths=torch.tensor([3, 2] * (n // 2)),
        truncated=torch.tensor([False, True] * (n // 2)),
        group_size=G,
    )


def _source(tmp_path, tokenizer, rows, **data):
    path = _write(tmp_path / "d.jsonl", rows)
    cfg = load_config(
        None,
        {
            "data": {"path": str(path), **data},
            "reward": {"accuracy": "math", "correct_threshold": 0.5},
            "algo": {"soft_overlong": False},
            "rollout": {"prompts_per_step": 1},
        },
    )
    return cfg, load_prompts(cfg, tokenizer, None)


def test_trl_kwargs_for_string_and_chat_prompts(tmp_path, tokenizer):
    rows = [
        {"prompt": "What is 2+2?", "answer": "4", "level": 1},
        {"prompt": [{"role": "user", "content": "What is 3+3?"}], "answer": 6, "level": 2},
    ]
    cfg, source = _source(tmp_path, tokenizer, rows, prompt_template="Q: {question}")
    scorer = Scorer.build(cfg, None, functions={"math": recording})
    prompts = [source.train[0], source.train[0], source.train[1], source.train[1]]
    SEEN.clear()
    scores = scorer(prompts, ["ab", "abcd", "x", "xy"], _rollout(4, 2), step=7)
    got = SEEN[0]
    assert got["prompts"][0] == "Q: What is 2+2?"  # the template applied, no chat markup
    assert got["prompts"][2] == [{"role": "user", "content": "What is 3+3?"}]
    assert got["completions"][:2] == ["ab", "abcd"]  # a string prompt: string completions
    assert got["completions"][2] == [{"role": "assistant", "content": "x"}]  # chat: messages
    assert got["ids"] == [[0, 1, 2], [3, 4], [6, 7, 8], [9, 10]]  # EOS included, no padding
    assert got["answer"] == ["4", "4", "6", "6"] and got["level"] == [1, 1, 2, 2]
    assert got["prompt_texts"][0].startswith("<|im_start|>user\nQ: What is 2+2?")
    assert got["trainer_state"].global_step == 7
    assert got["trainer_state"].max_steps == cfg.train.max_steps
    assert got["group_ids"] == [0, 0, 1, 1] and got["truncated"] == [False, True, False, True]
    assert got["completion_lengths"] == [3, 2, 3, 2]
    assert got["max_new_tokens"] == cfg.rollout.max_new_tokens
    assert set(got) - {"ids", "level"} <= set(RESERVED_KWARGS)
    # correct = the accuracy score above reward.correct_threshold (0.5 here)
    assert scores.terms["accuracy"].tolist() == [2.0, 4.0, 1.0, 2.0]
    assert scores.correct.tolist() == [True, True, True, True]


def test_correct_threshold_defaults_to_score_above_zero(tmp_path, tokenizer):
    def signed(completions, **kwargs):  # DAPO-style +1 / -1 and a 0 for "no answer"
        return [{"a": 1.0, "b": -1.0, "c": 0.0}[c] for c in completions]

    cfg, source = _source(tmp_path, tokenizer, [{"prompt": "q", "answer": "1"}])
    for threshold, want in ((0.0, [True, False, False, False]), (-0.5, [True, False, True, True])):
        cfg2 = load_config(
            None,
            {
                "data": {"path": cfg.data.path},
                "reward": {"accuracy": "math", "correct_threshold": threshold},
                "rollout": {"prompts_per_step": 1},
            },
        )
        scorer = Scorer.build(cfg2, None, functions={"math": signed})
        _, correct = scorer.accuracy([source.train[0]] * 4, ["a", "b", "c", "c"], _rollout(4, 4))
        assert correct.tolist() == want


@pytest.mark.parametrize(
    "column", ["truncated", "completion_lengths", "group_ids", "max_new_tokens", "on_error",
               "completions", "trainer_state", "completion_ids"],
)  # fmt: skip
def test_reserved_column_is_refused_at_load(tmp_path, tokenizer, column):
    rows = [{"prompt": "q", "answer": "1"}, {"prompt": "q2", "answer": "2", column: 1}]
    with pytest.raises(DatasetError) as e:
        _source(tmp_path, tokenizer, rows)
    msg = str(e.value)
    assert "d.jsonl:2" in msg and f"'{column}'" in msg and "prompts, completions" in msg


def test_answer_column_reaches_rewards_under_its_own_name(tmp_path, tokenizer):
    rows = [{"question": "q", "solution": "7"}]
    cfg, source = _source(
        tmp_path, tokenizer, rows, prompt_field="question", answer_field="solution"
    )
    scorer = Scorer.build(cfg, None, functions={"math": recording})
    SEEN.clear()
    scorer([source.train[0]] * 2, ["a", "b"], _rollout(2, 2))
    assert SEEN[0]["solution"] == ["7", "7"] and SEEN[0]["answer"] == ["7", "7"]
