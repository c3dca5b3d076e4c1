"""Config layers, presets, validation and error messages."""

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from rlvr.config.load import apply_changes, dump_yaml, help_text, load_config, parse_overrides
from rlvr.config.presets import PRESETS
from rlvr.config.schema import ConfigError


def test_default_is_dapo_on_tiny_model():
    cfg = load_config()
    assert cfg.preset == "dapo"
    assert cfg.model.name_or_path == "rlvr-tiny"
    a = cfg.algo
    assert (a.clip_low, a.clip_high, a.kl_coef, a.agg) == (0.2, 0.28, 0.0, "token_mean")
    assert a.dynamic_sampling and a.overlong_filter and a.soft_overlong
    assert cfg.reward.wrong_score == -1.0


def test_grpo_preset_is_the_paper():
    a = load_config(preset="grpo").algo
    assert (a.clip_low, a.clip_high, a.kl_coef, a.kl_kind, a.agg) == (
        0.2,
        0.2,
        0.04,
        "k3",
        "sample_mean",
    )
    assert not (a.dynamic_sampling or a.overlong_filter or a.soft_overlong)


def test_dr_grpo_preset():
    a = load_config(preset="dr_grpo").algo
    assert (a.advantage, a.agg, a.kl_coef) == ("dr_grpo", "token_sum_norm", 0.0)


def test_yaml_holds_only_changes_and_overrides_win(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("preset: grpo\nalgo:\n  clip_high: 0.3\nrollout:\n  group_size: 4\n")
    cfg = load_config(f, ["--algo.clip_high=0.25", "--train.max_steps=7"])
    assert cfg.preset == "grpo"
    assert cfg.algo.clip_high == 0.25  # command line beats the file
    assert cfg.rollout.group_size == 4  # file beats the preset
    assert cfg.algo.kl_coef == 0.04  # preset beats the default
    assert cfg.train.max_steps == 7


def test_tiny_defaults_apply_only_to_the_builtin_model(tmp_path):
    assert load_config().optim.lr == 4e-4
    model_dir = tmp_path / "m"
    model_dir.mkdir()
    cfg = load_config(None, {"model": {"name_or_path": str(model_dir)}})
    assert cfg.optim.lr == 1e-6  # the papers' default for real models


def test_tiny_preset_defaults_follow_the_preset(tmp_path):
    ppo = load_config(None, [], preset="ppo")
    assert (ppo.optim.lr, ppo.train.max_steps, ppo.critic.lr) == (2e-4, 200, 1e-3)
    assert load_config(None, [], preset="grpo").optim.lr == 4e-4  # other presets keep 4e-4
    assert load_config(None, ["--optim.lr=3e-4"], preset="ppo").optim.lr == 3e-4  # user wins
    sort = load_config(None, ["--data.task=sort"], preset="ppo")
    assert (sort.optim.lr, sort.rollout.max_new_tokens) == (2e-4, 16)  # both layers apply
    model_dir = tmp_path / "m"
    model_dir.mkdir()
    real = load_config(None, [f"--model.name_or_path={model_dir}"], preset="ppo")
    assert real.optim.lr == 1e-6 and real.train.max_steps != 200  # not for a real model


def test_tiny_task_defaults_follow_the_task(tmp_path):
    assert load_config().rollout.max_new_tokens == 32  # arithmetic: the default run
    assert load_config(None, ["--data.task=sort"]).optim.lr == 4e-4  # the shared lr
    chain = load_config(None, ["--data.task=chain"])  # half the shared lr
    assert (chain.rollout.max_new_tokens, chain.optim.lr, chain.train.max_steps) == (64, 2e-4, 280)
    calc = load_config(None, ["--data.task=calc"], preset="grpo")
    assert (calc.rollout.max_new_tokens, calc.rollout.max_total_tokens) == (160, 224)
    assert calc.rollout.tools == ()  # the task's own tool
    dapo_calc = load_config(None, ["--data.task=calc"])  # derailed calls are not masked away
    assert (dapo_calc.algo.overlong_filter, dapo_calc.optim.lr) == (False, 2e-4)
    assert (dapo_calc.train.max_steps, dapo_calc.train.entropy_floor) == (150, 0.003)
    assert load_config(
        None, ["--data.task=calc", "--algo.overlong_filter=true"]
    ).algo.overlong_filter
    assert load_config(None, ["--data.task=arithmetic"]).algo.overlong_filter  # dapo's own
    f = tmp_path / "c.yaml"
    f.write_text("data:\n  task: chain\nrollout:\n  max_new_tokens: 40\n")
    assert load_config(f).rollout.max_new_tokens == 40  # the user's value wins
    assert load_config(f, ["--rollout.max_new_tokens=48"]).rollout.max_new_tokens == 48
    data = tmp_path / "d.jsonl"
    data.write_text('{"prompt": "1+1", "answer": "2"}\n')
    cfg = load_config(None, ["--data.task=chain", f"--data.path={data}"])
    assert cfg.rollout.max_new_tokens == 32  # a dataset, not the task
    model_dir = tmp_path / "m"
    model_dir.mkdir()
    cfg = load_config(None, ["--data.task=chain", f"--model.name_or_path={model_dir}"])
    assert cfg.rollout.max_new_tokens == 32


def test_resolved_config_round_trips(tmp_path):
    cfg = load_config(None, ["--reward.extra=format=0.5"])
    f = tmp_path / "resolved.yaml"
    f.write_text(dump_yaml(cfg))
    again = load_config(f)
    assert again == cfg


@pytest.mark.parametrize(
    ("override", "message"),
    [
        (
            "--algo.clip_hgh=0.3",
            r"unknown key algo\.clip_hgh; did you mean algo\.clip_high\?; valid keys of algo: ",
        ),
        ("--algos.clip_high=0.3", r"unknown section 'algos'; did you mean algo\?; valid: model"),
        ("--algo.agg=mean", r"algo\.agg: got 'mean', expected one of 'sample_mean'"),
        ("--algo.clip_low=1.5", r"algo\.clip_low: got 1\.5, expected 0 <= clip_low <= 1"),
        ("--algo.clip_high=abc", r"algo\.clip_high: got 'abc', expected a number"),
        ("--rollout.group_size=1", r"rollout\.group_size: got 1, expected >= 2"),
        ("--rollout.group_size=2.5", r"rollout\.group_size: got '2\.5', expected an integer"),
        ("--algo.dynamic_sampling=maybe", r"algo\.dynamic_sampling: got 'maybe', expected true"),
        ("--algo.mini_batches=3", r"algo\.mini_batches: got 3, expected a divisor"),
        ("--data.task=chess", r"data\.task: got 'chess', expected one of 'arithmetic'"),
        ("--data.path=/nonexistent/x.jsonl", r"data\.path: /nonexistent/x\.jsonl does not exist"),
        ("--algo.overlong_cache=40", r"algo\.overlong_cache: got 40, expected 0 < overlong_cache"),
        ("clip_high=0.3", r"expected --section\.key=value"),
    ],
)
def test_bad_values_name_the_key(override, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, [override])


def test_unknown_preset():
    with pytest.raises(ConfigError, match=r"unknown preset 'ppo2'; valid presets: grpo, dapo"):
        load_config(preset="ppo2")


def test_bad_yaml_names_the_file(tmp_path):
    f = tmp_path / "bad.yaml"
    f.write_text("algo: [1, 2\n")
    with pytest.raises(ConfigError, match=r"bad\.yaml: not valid YAML"):
        load_config(f)
    f.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match=r"bad\.yaml: expected a mapping"):
        load_config(f)
    with pytest.raises(ConfigError, match=r"missing\.yaml does not exist"):
        load_config(tmp_path / "missing.yaml")


def test_every_field_is_documented_in_help():
    text = help_text()
    for line in text.splitlines():
        if line.startswith("  --"):
            assert not line.rstrip().endswith(")"), f"undocumented: {line}"


def test_parse_overrides():
    assert parse_overrides(["--a.b=1", "c.d=x=y"]) == {"a": {"b": "1"}, "c": {"d": "x=y"}}


def test_presets_only_name_real_keys():
    from rlvr.config.schema import Config

    for name, changes in PRESETS.items():
        apply_changes(Config(), changes, name)  # raises on an unknown key


_section = st.sampled_from(["model", "data", "rollout", "algo", "reward", "optim", "train", "x"])
_key = st.text(alphabet="abcdefghijklmnopqrstuvwxyz_", min_size=1, max_size=14)
_value = st.one_of(
    st.text(max_size=12),
    st.integers(-5, 10**6),
    st.floats(allow_nan=True),
    st.booleans(),
    st.none(),
    st.lists(st.integers(), max_size=3),
)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(_section, st.dictionaries(_key, _value, max_size=3), max_size=3))
def test_fuzz_loader_raises_only_config_errors(tmp_path_factory, changes):
    """Random sections, keys and values: either a valid config or a ConfigError, nothing else."""
    path = tmp_path_factory.mktemp("fuzz") / "c.yaml"
    path.write_text(yaml.safe_dump(changes))
    try:
        load_config(path)
    except ConfigError as e:
        assert str(e)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.text(max_size=30), max_size=4))
def test_fuzz_command_line_overrides(args):
    try:
        load_config(None, args)
    except ConfigError as e:
        assert str(e)


def test_reward_params_from_yaml_and_command_line(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("reward:\n  params:\n    math:\n      signed: false\n")
    assert load_config(f).reward.params == {"math": {"signed": False}}
    cfg = load_config(None, ['--reward.params={"format": {"mode": "lenient"}}'])
    assert cfg.reward.params == {"format": {"mode": "lenient"}}
    with pytest.raises(ConfigError, match=r"reward\.params: got .*expected a mapping of name"):
        load_config(None, ["--reward.params=[1, 2]"])


def test_engine_is_validated():
    assert load_config().rollout.engine == "fast"
    assert load_config(None, ["--rollout.engine=hf"]).rollout.engine == "hf"
    with pytest.raises(ConfigError, match=r"rollout\.engine: got 'vllm2', expected one of 'fast'"):
        load_config(None, ["--rollout.engine=vllm2"])


NONFINITE = ["nan", "inf", "-inf", "1e999", "NaN", "Infinity"]


@pytest.mark.parametrize("value", NONFINITE)
@pytest.mark.parametrize(
    "key",
    [
        "optim.lr",
        "optim.max_grad_norm",
        "reward.correct_score",
        "reward.wrong_score",
        "reward.format_weight",
        "algo.clip_high",
        "algo.kl_coef",
        "rollout.temperature",
    ],
)
def test_non_finite_numbers_are_refused_by_name(key, value):
    with pytest.raises(ConfigError, match=f"^{key}: got '{value}', expected a finite number$"):
        load_config(None, [f"--{key}={value}"])


def test_non_finite_numbers_from_yaml(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("optim:\n  lr: .inf\nreward:\n  correct_score: .nan\n")
    with pytest.raises(ConfigError, match="expected a finite number"):
        load_config(path)


def test_negative_lr_and_non_finite_reward_weight():
    with pytest.raises(ConfigError, match=r"^optim\.lr: got -0\.001, expected > 0$"):
        load_config(None, ["--optim.lr=-1e-3"])
    with pytest.raises(ConfigError, match=r"reward\.extra: got 'length=1e999'"):
        load_config(None, ["--reward.extra=length=1e999"])


def test_machine_values_are_refused_by_name():
    with pytest.raises(ConfigError, match=r"^train\.threads: got 100000, expected 0 .* CPUs\)$"):
        load_config(None, ["--train.threads=100000"])
    with pytest.raises(ConfigError, match=r"^model\.device: got 'bogus', expected auto, cpu"):
        load_config(None, ["--model.device=bogus"])
    assert load_config(None, ["--model.device=cuda:1"]).model.device == "cuda:1"  # checked at run


@pytest.mark.parametrize(
    "override, message",
    [
        ("--optim.lr=inf", "error: optim.lr: got 'inf', expected a finite number"),
        ("--reward.correct_score=nan", "error: reward.correct_score: got 'nan', expected a finite"),
        ("--train.threads=100000", "error: train.threads: got 100000, expected 0"),
        ("--model.device=bogus", "error: model.device: got 'bogus'"),
        (
            "--rollout.prompts_per_step=100000",
            "error: rollout.prompts_per_step: got 100000, expected at most the 64 training",
        ),
    ],
)
def test_cli_refuses_bad_values_with_one_error_line(tmp_path, override, message):
    import subprocess
    import sys

    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "rlvr",
            "train",
            override,
            "--data.train_size=64",
            "--max-steps=1",
            f"--output-dir={tmp_path / 'run'}",
            "--no-progress",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 2, res.stderr
    assert "Traceback" not in res.stderr and message in res.stderr, res.stderr


def test_rollout_engine_literal_names_every_engine():
    from typing import get_args, get_type_hints

    from rlvr.config.schema import RolloutConfig
    from rlvr.rollout import ENGINES

    assert set(get_args(get_type_hints(RolloutConfig)["engine"])) == set(ENGINES)
