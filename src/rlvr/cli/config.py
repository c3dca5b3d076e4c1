"""`rlvr config show [train arguments]`: the config a run with those arguments would use."""

from __future__ import annotations

import sys

from rlvr.cli.arguments import train_request
from rlvr.config.load import dump_yaml

SUMMARY = "config show [train arguments]: the config a run would use, as YAML"


def run(argv: list[str]) -> int:
    """`rlvr config show [train arguments]`: the resolved config.yaml of that run, printed."""
    if not argv or argv[0] not in ("show",):
        if argv and argv[0] not in ("-h", "--help"):
            sys.stderr.write(f"rlvr config: unknown subcommand {argv[0]!r}; valid: show\n")
            return 2
        print(
            "usage: rlvr config show [rlvr train arguments]\n\n  show    the config those "
            "arguments would run (presets and the built-in model's defaults applied), as YAML"
        )
        return 0
    request = train_request(argv[1:], prog="rlvr config show")
    sys.stdout.write(dump_yaml(request.cfg))
    return 0
