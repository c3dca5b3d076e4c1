"""What runs is what is shown: `rlvr config show [train arguments]` prints the resolved
config, `rlvr train --help` lists the same values, preset lists come from the registry, and
the commands import their shared pieces from one module, not from each other."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
import yaml

import rlvr
from rlvr.cli.main import main
from rlvr.config.load import flat_keys, load_config, to_dict
from rlvr.config.presets import PRESETS
from rlvr.config.schema import Config

SRC = Path(rlvr.__file__).parent


def show(capsys, *argv: str) -> dict:
    capsys.readouterr()
    assert main(["config", "show", *argv]) == 0
    return yaml.safe_load(capsys.readouterr().out)


def help_values(capsys, *argv: str) -> dict[str, str]:
    capsys.readouterr()
    with pytest.raises(SystemExit) as info:
        main(["train", *argv, "--help"])
    assert info.value.code == 0
    text = capsys.readouterr().out
    return dict(re.findall(r"^  --(\w+\.[\w.]+)=(.*?)  \(", text, re.M))


def test_config_show_prints_the_default_runs_values_not_the_schemas(capsys):
    shown = show(capsys)
    run = load_config(None)
    schema = Config()
    for section, key in [("optim", "lr"), ("algo", "clip_low"), ("algo", "clip_high"),
                         ("algo", "dynamic_sampling"), ("train", "threads")]:  # fmt: skip
        assert shown[section][key] == getattr(getattr(run, section), key)
    # the values the default run uses differ from the dataclass defaults in these keys
    assert shown["optim"]["lr"] != schema.optim.lr
    assert shown["algo"]["clip_high"] != schema.algo.clip_high
    assert shown["algo"]["dynamic_sampling"] != schema.algo.dynamic_sampling
    assert shown["train"]["threads"] != schema.train.threads
    assert shown == yaml.safe_load(yaml.safe_dump(to_dict(run)))


@pytest.mark.parametrize("argv", [(), ("--preset", "ppo", "--optim.lr=3e-4")])
def test_train_help_agrees_with_config_show_on_every_key(capsys, argv):
    shown = show(capsys, *argv)
    shown = {s: flat_keys(s, v) for s, v in shown.items() if isinstance(v, dict)}
    listed = help_values(capsys, *argv)
    assert len(listed) == sum(len(v) for v in shown.values())
    assert "rollout.vllm.memory" in listed  # an engine's section, key by key
    for dotted, text in listed.items():
        section, key = dotted.split(".", 1)
        value = shown[section][key]
        value = tuple(value) if isinstance(value, list) else value
        assert text == repr(value), dotted


def test_config_show_takes_trains_arguments(capsys, tmp_path):
    (tmp_path / "c.yaml").write_text("rollout:\n  group_size: 4\n")
    shown = show(capsys, str(tmp_path / "c.yaml"), "--preset", "ppo", "--max-steps", "7",
                 "--algo.kl_coef=0.01")  # fmt: skip
    assert shown["preset"] == "ppo" and shown["optim"]["lr"] == 2e-4  # ppo's tiny-model lr
    assert shown["rollout"]["group_size"] == 4 and shown["train"]["max_steps"] == 7
    assert shown["algo"]["kl_coef"] == 0.01


def test_config_show_refuses_a_bad_key_in_one_line(capsys):
    assert main(["config", "show", "--algo.clip_hgh=0.3"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and "algo.clip_hgh" in err[0]


def test_preset_lists_come_from_the_registry(capsys):
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    doc = " ".join(rlvr.train.__doc__.split())
    for name in PRESETS:
        assert re.search(rf"--preset PRESET .*\b{name}\b", text), name
        assert re.search(rf"preset: one of .*\b{name}\b", doc), name


def _imports(path: Path) -> list[tuple[str, list[str]]]:
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            out.append((node.module, [a.name for a in node.names]))
        elif isinstance(node, ast.Import):
            out.extend((a.name, []) for a in node.names)
    return out


def test_the_commands_do_not_import_each_other_or_private_names():
    """The command line is the top of the house: nothing below it imports `rlvr.cli`, a
    command reaches the dispatch never, and no command imports another module's private
    names."""
    for path in SRC.rglob("*.py"):
        if path.name == "__main__.py":
            continue
        in_cli = path.parent.name == "cli"
        for module, names in _imports(path):
            if not in_cli:
                assert not module.startswith("rlvr.cli"), (
                    f"{path.relative_to(SRC)} imports {module}"
                )
                continue
            assert module not in ("rlvr.cli", "rlvr.cli.main") or path.name in ("__init__.py",), (
                f"{path.relative_to(SRC)} imports the dispatch"
            )
            private = [n for n in names if n.startswith("_")]
            assert module == "__future__" or not private, (path.name, module, private)
