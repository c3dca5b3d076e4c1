"""Graceful stop: the first SIGINT/SIGTERM asks the loop to finish its step, save and exit 0;
a second one exits at once (checkpoints are atomic, so nothing on disk is left half-written)."""

from __future__ import annotations

import os
import signal
import sys
import threading


class StopSignal:
    def __init__(self) -> None:
        self.requested = False
        self._previous: dict[int, object] = {}

    def _handle(self, signum, frame) -> None:
        if self.requested:
            sys.stderr.write("second signal: exiting now\n")
            os._exit(128 + signum)
        self.requested = True
        sys.stderr.write(
            f"\n{signal.Signals(signum).name}: finishing this step, then saving "
            "(send again to exit at once)\n"
        )

    def __enter__(self) -> StopSignal:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()
