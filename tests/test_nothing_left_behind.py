"""A run directory exists only for a run that started: a config, data, reward or model error
leaves nothing in runs/ or the output directory, a failure before the first step takes back
what the run wrote, and a user's own files are never overwritten or removed."""

from __future__ import annotations

import pytest

import rlvr
from rlvr.cli.main import main
from rlvr.config.load import load_config
from rlvr.config.schema import ConfigError
from rlvr.run.rundir import prepare_run_dir, unlock_run_dir
from test_api import exact_answer, rows

SMALL = ["--rollout.prompts_per_step=2", "--rollout.group_size=2",
         "--rollout.max_new_tokens=8", "--algo.overlong_cache=2", "--no-progress"]  # fmt: skip


def _tree(path):
    return sorted(str(p.relative_to(path)) for p in path.rglob("*")) if path.exists() else []


@pytest.mark.parametrize(
    "config", [{"algo.agg": "mean"}, {"nosuch.key": 1}, {"reward.accuracy": "nosuch:fn"}]
)
def test_an_api_error_leaves_no_run_directory(tmp_path, monkeypatch, config):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError):
        rlvr.train(reward_funcs=None, train_dataset=rows(4, 0), config=config,
                   show_progress=False)  # fmt: skip
    assert _tree(tmp_path / "runs") == []  # no runs/<timestamp>/data/train.jsonl


def test_an_api_error_in_a_given_output_dir_keeps_only_the_users_files(tmp_path):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    with pytest.raises(ConfigError):
        rlvr.train(reward_funcs=[exact_answer], train_dataset=rows(4, 0),
                   config={"algo.agg": "mean"}, output_dir=out, show_progress=False)  # fmt: skip
    assert _tree(out) == ["notes.txt"] and (out / "notes.txt").read_text() == "keep me"


@pytest.mark.parametrize(
    "bad",
    [["--reward.accuracy=nosuch.py:acc"],  # a reward that cannot be loaded
     ["--data.path=missing.jsonl", "--reward.accuracy=math"],  # data that is not there
     ["--model.name_or_path=./no-such-model"]],  # a model that is not there
)  # fmt: skip
def test_a_cli_error_leaves_no_run_directory(tmp_path, monkeypatch, capsys, bad):
    monkeypatch.chdir(tmp_path)
    assert main(["train", *bad, "--output-dir", "run", *SMALL]) != 0
    assert capsys.readouterr().err.strip().count("\n") == 0  # one line
    assert not (tmp_path / "run").exists()  # no config.yaml, no rlvr.lock
    assert main(["train", *bad, *SMALL]) != 0
    assert _tree(tmp_path / "runs") == []


def test_a_reward_failing_in_the_first_evaluation_takes_back_the_logs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "r.py").write_text("def acc(completions, **kwargs):\n    raise ValueError('x')\n")
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "notes.txt").write_text("keep me")
    rc = main(["train", "--reward.accuracy=r.py:acc", "--output-dir", "run",
               "--train.eval_size=2", *SMALL])  # fmt: skip
    assert rc == 1
    assert _tree(tmp_path / "run") == ["notes.txt"]  # no metrics.jsonl, tensorboard/, lock


def test_the_users_config_yaml_in_the_output_dir_is_never_overwritten(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.chdir(tmp_path)
    mine = "rollout:\n  group_size: 2\n# my notes\n"
    (tmp_path / "config.yaml").write_text(mine)
    assert main(["train", "config.yaml", "--output-dir", ".", *SMALL]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        f"error: train.output_dir: {tmp_path} already holds config.yaml (not a run's: no "
        "rlvr.lock), which the run would overwrite; choose a new or empty --output-dir"
    )
    assert (tmp_path / "config.yaml").read_text() == mine
    assert _tree(tmp_path) == ["config.yaml"]


def test_discard_takes_back_only_what_this_process_added(tmp_path):
    from rlvr.run.rundir import discard_unstarted

    run = tmp_path / "run"
    (run / "data").mkdir(parents=True)
    (run / "data" / "mine.csv").write_text("x")
    cfg = load_config(None, {"train": {"output_dir": str(run)}})
    prepare_run_dir(cfg, resume=False)
    (run / "data" / "train.jsonl").write_text("{}\n")
    (run / "metrics.jsonl").write_text("")
    (run / "other.txt").write_text("not a run's name: whoever wrote it, it stays")
    discard_unstarted(run)
    assert _tree(run) == ["data", "data/mine.csv", "other.txt"]
    made = tmp_path / "new"
    prepare_run_dir(load_config(None, {"train": {"output_dir": str(made)}}), resume=False)
    discard_unstarted(made)
    assert not made.exists()


def test_a_started_run_is_never_discarded(tmp_path):
    from rlvr.run.rundir import discard_unstarted, started

    run = tmp_path / "run"
    prepare_run_dir(load_config(None, {"train": {"output_dir": str(run)}}), resume=False)
    started(run)
    discard_unstarted(run)
    unlock_run_dir(run)
    assert (run / "config.yaml").is_file()
