"""`rlvr COMMAND ...`: the dispatch. Each command is a module of this package named as the
command, with `SUMMARY` (its line of `rlvr --help`) and `run(argv) -> exit code`; the usage is
made from them, and only the command that runs is imported. An error a user can fix is one
line on stderr, never a traceback."""

from __future__ import annotations

import importlib
import os
import sys

from rlvr.config.schema import ConfigError
from rlvr.data.errors import DatasetError
from rlvr.models import progress_bars
from rlvr.rewards.combine import RewardError
from rlvr.rollout.server import ServerError
from rlvr.run.checkpoint import CheckpointError
from rlvr.run.distributed import torchrun_rank
from rlvr.run.health import TrainingHealthError

COMMANDS = ("train", "eval", "export", "plot", "ablate", "rm", "config")


def command(name: str):
    """The module of command `name` (rlvr.cli.<name>)."""
    return importlib.import_module(f"rlvr.cli.{name}")


def usage() -> str:
    width = max(map(len, COMMANDS))
    lines = [f"  {name:<{width}}  {command(name).SUMMARY}" for name in COMMANDS]
    return (
        f"usage: rlvr {{{','.join(COMMANDS)}}} ...\n\n"
        + "\n".join(lines)
        + "\n\nrlvr COMMAND --help for details."
    )


def main(argv: list[str] | None = None) -> int:
    rc = _main(argv)
    if torchrun_rank():
        # A rank ends here without interpreter teardown: destroying gloo's process group can
        # deadlock on the GIL (distributed.shutdown), and leaving it to teardown aborts.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(rc)
    return rc


def _main(argv: list[str] | None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in COMMANDS:
        if argv and argv[0] not in ("-h", "--help"):
            print(
                f"rlvr: unknown command {argv[0]!r}; valid: {', '.join(COMMANDS)}", file=sys.stderr
            )
            return 2
        print(usage())
        return 0
    quiet = "--no-progress" in argv
    if quiet:  # none of transformers' bars either (loading, saving shards), in child processes
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    try:
        with progress_bars(not quiet):  # and in this one, where transformers is imported
            return command(argv[0]).run(argv[1:])
    except (ConfigError, FileNotFoundError, CheckpointError, DatasetError) as e:
        sys.stderr.write(f"error: {e}\n")  # plain text: a message may hold [brackets]
        return 2
    except RewardError as e:  # under reward.on_error=raise; on_error=zero scores it 0
        sys.stderr.write(f"error: {e} (reward.on_error=zero scores such samples 0)\n")
        return 1
    except (TrainingHealthError, ServerError) as e:
        sys.stderr.write(f"error: {e}\n")
        return 1
    except OSError as e:  # a read-only or full output directory, a file removed mid-run
        where = f"{e.filename}: " if e.filename else ""
        sys.stderr.write(f"error: {where}{e.strerror or e}\n")
        return 2
