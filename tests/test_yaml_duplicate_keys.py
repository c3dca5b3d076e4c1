"""A key written twice in one YAML mapping (a config, `rm.yaml`, a run's `config.yaml`) is
an error naming the file, the key and both lines, never the last value kept silently."""

import re

import pytest
import yaml

from rlvr.cli.main import main
from rlvr.config.load import load_config
from rlvr.config.safe_yaml import load_yaml
from rlvr.config.schema import ConfigError

# clip_high set at the top of `algo`, then again four lines down
TWICE = """\
algo:
  clip_high: 0.28
  clip_low: 0.2
  kl_coef: 0.0
  clip_high: 5.0
train:
  max_steps: 1
"""


def test_the_control_plain_yaml_keeps_the_last_value():
    assert yaml.safe_load(TWICE)["algo"]["clip_high"] == 5.0


def test_a_key_twice_in_a_config_file_names_the_file_key_and_lines(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text(TWICE)
    with pytest.raises(ConfigError) as e:
        load_config(path)
    assert str(e.value).startswith(
        f"{path}: key 'algo.clip_high' appears twice, on line 2 and line 5"
    )


def test_the_cli_says_it_in_one_line(tmp_path, capsys):
    path = tmp_path / "config.yaml"
    path.write_text("train:\n  max_steps: 1\ntrain:\n  max_steps: 2\n")
    assert main(["train", str(path), "--output-dir", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{path}: key 'train' appears twice, on line 1 and line 3" in err[0]
    assert not (tmp_path / "run").exists()


def test_a_run_config_and_rm_yaml_are_checked_the_same(tmp_path, capsys):
    """`rlvr rm CONFIG` reads its file through the same loader: its `rm:` section too."""
    path = tmp_path / "rm.yaml"
    path.write_text("rm:\n  epochs: 1\n  lr: 0.001\n  epochs: 3\n")
    assert main(["rm", str(path), "--output-dir", str(tmp_path / "run")]) == 2
    assert f"{path}: key 'rm.epochs' appears twice, on line 2 and line 4" in capsys.readouterr().err


@pytest.mark.parametrize(
    "text, key, lines",
    [
        ("a: [1, {b: 1, c: 2, b: 3}]", "a[1].b", (1, 1)),  # inside a list
        ("yes: 1\ntrue: 2\n", "True", (1, 2)),  # two spellings of one key
        ("null: 1\n~: 2\n", "None", (1, 2)),
    ],
)
def test_keys_compare_as_they_load(text, key, lines):
    expected = f"x.yaml: key '{key}' appears twice, on line {lines[0]} and line {lines[1]};"
    with pytest.raises(ConfigError, match=re.escape(expected)):
        load_yaml(text, "x.yaml")


def test_one_key_in_separate_mappings_and_merges_are_fine():
    text = "a: &x {b: 1}\nc: *x\nd: {<<: *x, b: 2}\ne: {b: 3}\n"
    assert load_yaml(text, "x.yaml") == {"a": {"b": 1}, "c": {"b": 1}, "d": {"b": 2}, "e": {"b": 3}}
