"""docs/reference/cli.md names every flag each command's --help lists (config keys,
`--section.key`, are the configuration reference's: tests/test_config_reference.py)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from rlvr.cli.main import main

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "reference" / "cli.md"
COMMANDS = (["train"], ["eval"], ["export"], ["plot"], ["ablate"], ["rm"], ["config", "show"])
FLAG = re.compile(r"(?<![\w.-])--[a-z][a-z0-9-]*(?![\w.])")
SECTIONS = {"--algo", "--critic", "--data", "--model", "--optim", "--reward", "--rollout",
            "--train", "--rm", "--section", "--help"}  # fmt: skip


def _help_flags(command: list[str], capsys) -> set[str]:
    with pytest.raises(SystemExit) as stop:
        main([*command, "--help"])
    assert stop.value.code == 0
    out = capsys.readouterr()
    return set(FLAG.findall(out.out + out.err)) - SECTIONS


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_every_flag_of_the_command_is_on_the_cli_page(command, capsys):
    page = PAGE.read_text(encoding="utf-8")
    flags = _help_flags(command, capsys)
    assert flags, command  # the pattern found the command's flags
    missing = sorted(f for f in flags if f"`{f}" not in page)
    assert missing == [], f"docs/reference/cli.md lacks {missing} of rlvr {' '.join(command)}"


def test_the_flag_pattern_skips_config_keys():
    text = "--max-steps N  --rollout.group_size=16  --algo.clip_high  (--no-progress)"
    assert set(FLAG.findall(text)) == {"--max-steps", "--no-progress"}
