"""`rlvr COMMAND ...`: the dispatch. Each command is a module of this package named as the
command, with `SUMMARY` (its line of `rlvr --help`) and `run(argv) -> exit code`; the usage is
made from them, and only the command that runs is imported. An error a user can fix is one
line on stderr, never a traceback."""

from __future__ import annotations

import importlib
import os
import sys
from contextlib import nullcontext

from rlvr.run.launch import torchrun_rank

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
    if quiet:  # none of transformers' bars either (loading, saving shards), here and in children
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    try:
        with _bars_off() if quiet else nullcontext():
            return command(argv[0]).run(argv[1:])
    except Exception as e:
        known = user_error(e)
        if known is None:
            raise
        rc, line = known
        sys.stderr.write(f"error: {line}\n")  # plain text: a message may hold [brackets]
        return rc


# The errors a user can act on, by module and class, with their exit codes: 2 for input (a
# config, a file, a checkpoint, a dataset), 1 for a run that failed. Looked up in sys.modules,
# so that `rlvr --help` imports none of them: an error of a module never imported was never
# raised.
ERRORS = (
    ("rlvr.config.schema", "ConfigError", 2, ""),
    ("rlvr.data.errors", "DatasetError", 2, ""),
    ("rlvr.run.manifest", "CheckpointError", 2, ""),
    # under reward.on_error=raise
    ("rlvr.rewards.combine", "RewardError", 1, " (reward.on_error=zero scores such samples 0)"),
    ("rlvr.run.health", "TrainingHealthError", 1, ""),
    ("rlvr.rollout.vllm_fleet", "VLLMServerError", 1, ""),
)


def user_error(e: BaseException) -> tuple[int, str] | None:
    """(exit code, the one line printed) for an error the user can act on; None for a bug
    (its traceback shows)."""
    for module, name, rc, hint in ERRORS:
        cls = getattr(sys.modules.get(module), name, None)
        if cls is not None and isinstance(e, cls):
            return rc, f"{e}{hint}"
    lost = getattr(sys.modules.get("rlvr.run.distributed"), "lost_rank", None)
    if lost is not None and (line := lost(e)) is not None:  # another rank gone mid-collective
        return 1, line
    if isinstance(e, FileNotFoundError):
        return 2, str(e)
    if isinstance(e, OSError):  # a read-only or full output directory, a file removed mid-run
        return 2, f"{e.filename}: {e.strerror or e}" if e.filename else str(e.strerror or e)
    return None


def _bars_off():
    """transformers' and the Hub's bars off in this process too, where transformers is already
    imported (a command run in-process); otherwise the environment variable does it."""
    if "transformers" not in sys.modules:
        return nullcontext()
    from rlvr.models import progress_bars

    return progress_bars(False)
