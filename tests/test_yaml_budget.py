"""YAML within a budget: a few hundred bytes of nested anchors (an alias bomb) as a config, an
override or a run's config.yaml fail at once with one line; error messages stay short
whatever value they quote; undecodable or absurdly nested files are named, not tracebacks."""

import re
import shutil
import time

import pytest
import yaml

from rlvr.cli.main import main
from rlvr.config.load import load_config
from rlvr.config.safe_yaml import MAX_VALUES, load_yaml
from rlvr.config.schema import ConfigError


def bomb(levels: int, width: int = 9) -> str:
    """reward.params.math holding `levels` anchors, each a list of `width` aliases of the one
    before: width**levels strings once expanded (9 levels: 387,420,489)."""
    lines = ["reward:", "  params:", "    math:", f"      a0: &a0 [{', '.join(['lol'] * width)}]"]
    for i in range(1, levels):
        lines.append(f"      a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * width)}]")
    return "\n".join(lines) + "\n"


def test_a_nine_level_alias_bomb_fails_fast(tmp_path):
    path = tmp_path / "bomb.yaml"
    path.write_text(bomb(9))
    assert len(path.read_bytes()) < 600
    start = time.perf_counter()
    with pytest.raises(ConfigError, match=f"aliases expand to more than {MAX_VALUES} values"):
        load_config(path)
    assert time.perf_counter() - start < 5  # unbudgeted: minutes, then a MemoryError


def test_the_control_a_plain_load_amplifies(tmp_path):
    """What the budget stops: the plain loader builds the 5-level bomb (328 bytes) in no time,
    and the first pass over it (here repr, as an error message would quote it) is over 1,000 times
    the file's size; the budgeted loader refuses it."""
    text = bomb(5)
    assert len(repr(yaml.safe_load(text))) > 1000 * len(text)
    with pytest.raises(ConfigError, match="alias bomb"):
        load_yaml(text, "x.yaml")


def test_an_alias_bomb_as_a_runs_config_is_one_line(small_run, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(small_run, run)
    (run / "config.yaml").write_text(bomb(9))
    capsys.readouterr()
    assert main(["train", "--resume", str(run), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "config.yaml: its aliases expand to more than" in err[0]


def test_error_messages_are_bounded(tmp_path):
    """A value under the alias budget quoted by an error is cut (a list of 6,561 strings, a
    1 MB override string); any ConfigError is at most MAX_CHARS."""
    path = tmp_path / "c.yaml"
    path.write_text("algo:\n  clip_high: [" + ", ".join(["lol"] * 9000) + "]\n")
    with pytest.raises(ConfigError, match=r"algo\.clip_high: got \['lol', 'lol'") as e:
        load_config(path)
    assert len(str(e.value)) < 200
    with pytest.raises(ConfigError, match="expected a number") as e:
        load_config(None, {"algo": {"clip_high": "9" * 1_000_000 + "x"}})
    assert len(str(e.value)) < 200
    assert len(str(ConfigError("y" * 10**6))) <= ConfigError.MAX_CHARS


@pytest.mark.parametrize(
    "content, expected",
    [
        (bytes(range(128, 256)) * 8, "not UTF-8 text (byte 0"),
        (b"a: " + b"[" * 100_000, "nested too deeply"),
        (b"a: [1, 2\nb: {", "not valid YAML"),
        (b"x: 1\n" * 300_000, "larger than 1048576 bytes"),
    ],
    ids=["random_bytes", "deep_nesting", "bad_yaml", "too_large"],
)
def test_unreadable_config_files_are_one_line(tmp_path, capsys, content, expected):
    path = tmp_path / "config.yaml"
    path.write_bytes(content)
    with pytest.raises(ConfigError, match=re.escape(expected)):
        load_config(path)
    capsys.readouterr()
    assert main(["train", str(path), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and expected in err[0]
