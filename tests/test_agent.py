"""Agents drive a run (`rlvr train --agent`, `rlvr.train(agent=...)`): the built-in tasks as
agent functions train end to end on the run's own endpoint; the calc task as a two-turn agent
trains on its sampled ids with the tool turns masked; a faulty agent's groups are dropped and
counted, or end the run."""

import functools
import json
from pathlib import Path

import pytest

pytest.importorskip("openai")

import agent_funcs
import rlvr
from rlvr.cli.main import main

AGENTS = Path(__file__).parent / "agent_funcs.py"
SMALL = {
    "rollout.prompts_per_step": 4,
    "rollout.group_size": 4,
    "train.eval_size": 8,
}


def _metrics(run):
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_cli_agent_trains_two_steps_and_resumes(tiny_model_dir, tmp_path, capsys):
    run = tmp_path / "run"
    argv = ["train", f"--model.name_or_path={tiny_model_dir}", "--agent", f"{AGENTS}:arithmetic"]
    argv += ["--max-steps", "2", "--output-dir", str(run), "--no-progress"]
    argv += [f"--{k}={v}" for k, v in SMALL.items()] + ["--rollout.max_new_tokens=12"]
    assert main(argv) == 0
    rows = _metrics(run)
    assert len(rows) == 2
    for row in rows:
        assert row["env/dropped"] == 0 and row["env/turns_per_rollout"] == 1
        assert row["responses"] % 16 == 0 and "time/agents" in row  # refills: whole batches
    assert f"{AGENTS}:arithmetic" in (run / "config.yaml").read_text()
    # a run directory's agent is code: a resume imports it only when it is named again
    resume = ["train", "--resume", str(run), "--max-steps", "3", "--no-progress"]
    assert main(resume) == 2
    assert f"its config.yaml names code to import: {AGENTS}:arithmetic" in capsys.readouterr().err
    assert main([*resume, "--agent", f"{AGENTS}:arithmetic"]) == 0
    assert [r["step"] for r in _metrics(run)] == [1, 2, 3]
    # evaluation samples with rlvr's own rollouts: the agent is not imported, nor asked for
    assert main(["eval", "--model", str(run), "--k", "1", "--num-prompts", "2"]) == 0


def test_async_agent_through_the_python_api(tmp_path):
    result = rlvr.train(
        "rlvr-tiny",
        config={**SMALL, "train.max_steps": 2},
        agent=agent_funcs.arithmetic_async,
        output_dir=tmp_path / "run",
        show_progress=False,
    )
    rows = _metrics(result.run_dir)
    assert [r["env/dropped"] for r in rows] == [0, 0] and rows[-1]["accuracy"] > 0


def test_dropped_groups_are_left_out_and_counted(tmp_path):
    result = rlvr.train(
        "rlvr-tiny",
        config={**SMALL, "train.max_steps": 1, "env.on_error": "drop", "algo.max_gen_batches": 1},
        agent=agent_funcs.raises,
        output_dir=tmp_path / "run",
        show_progress=False,
    )
    (row,) = _metrics(result.run_dir)
    assert row["env/dropped"] == 16 and row["env/faults/raised"] == 16
    assert row["groups/kept"] == 0 and row["groups/incomplete"] == 1


def test_a_raising_agent_ends_the_run_naming_it(tmp_path):
    with pytest.raises(Exception, match=r"env\.agent: .*the environment broke \[raised\]"):
        rlvr.train(
            "rlvr-tiny",
            config={**SMALL, "train.max_steps": 1},
            agent=agent_funcs.raises,
            output_dir=tmp_path / "run",
            show_progress=False,
        )


def test_calc_as_a_two_turn_agent_trains_five_steps_on_its_sampled_ids(tmp_path):
    replies: list = []
    result = rlvr.train(
        "rlvr-tiny",
        config={**SMALL, "data.task": "calc", "train.max_steps": 5},
        agent=functools.partial(agent_funcs.calc_two_turns, replies=replies),
        output_dir=tmp_path / "run",
        show_progress=False,
    )
    rows = _metrics(result.run_dir)
    assert len(rows) == 5 and len(replies) >= 5 * 16
    for row in rows:
        assert row["env/dropped"] == 0 and row["env/turns_per_rollout"] == 2
        # the tool's turn and the template's markup between the two turns: context, masked
        assert row["tools/tokens_per_sample"] > 0 and row["tools/turns_per_sample"] == 2
    for first, second in replies:
        sampled = first.choices[0].token_ids
        assert second.prompt_token_ids[: len(first.prompt_token_ids) + len(sampled)] == (
            first.prompt_token_ids + sampled
        )
