"""The command line, one module a command (`rlvr train | eval | export | plot | ablate | rm |
config`); `main` dispatches to them."""

from rlvr.cli.main import main

__all__ = ["main"]
