"""The Python API speaks for itself: its config errors name its arguments, not a command line;
`show_progress=False` silences transformers' bars too; a run without an eval set says so."""

from __future__ import annotations

import pytest

import rlvr
from rlvr.config.schema import ConfigError
from test_api import exact_answer, rows

ONE_STEP = {
    "train.max_steps": 1,
    "rollout.prompts_per_step": 2,
    "rollout.group_size": 2,
    "rollout.max_new_tokens": 8,
    "algo.overlong_cache": 2,
    "algo.dynamic_sampling": False,
}


def test_an_api_config_error_names_the_api_arguments(tmp_path):
    with pytest.raises(ConfigError, match=r"^rlvr\.train arguments: unknown section 'nosuch'"):
        rlvr.train(config={"nosuch.key": 1}, output_dir=tmp_path / "run", show_progress=False)


def test_no_progress_silences_transformers_and_names_the_missing_eval_set(
    tmp_path, tiny_model_dir, capfd
):
    rlvr.train(
        model=str(tiny_model_dir),
        reward_funcs=[exact_answer],
        train_dataset=rows(8, 0),
        config=ONE_STEP,
        output_dir=tmp_path / "run",
        show_progress=False,
    )
    err = capfd.readouterr().err
    assert "Loading weights" not in err
    assert "no held-out evaluation before training (no eval set: data.eval_path" in err
    assert "train.eval_size=0" not in err
