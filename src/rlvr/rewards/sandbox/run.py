"""Which isolation works here, and `run_python`, one program run to its end."""

from __future__ import annotations

import contextlib
import sys
import threading

from .process import SandboxProcess
from .spec import ISOLATIONS, Limits, SandboxError, SandboxResult, SandboxUnavailable

_probe_lock = threading.Lock()
_PIPE_BUF = 65536  # a Linux pipe's default capacity: a write this size never blocks
_probed: dict[str, str] = {}


def available_isolation() -> str:
    """The isolation that works here: "namespaces" if a probe run in them succeeds, else
    "none" (probed once)."""
    with _probe_lock:
        if "mode" not in _probed:
            mode = "none"
            if sys.platform == "linux":
                try:
                    r = _run("namespaces", {"p.py": "print(6*7)"}, ["p.py"], "", Limits(20))
                    if r.returncode == 0 and r.stdout.strip() == "42":
                        mode = "namespaces"
                    else:
                        _probed["why"] = f"probe exited {r.returncode}: {r.stderr.strip()[-300:]}"
                except (OSError, SandboxError) as e:
                    _probed["why"] = str(e)
            _probed["mode"] = mode
        return _probed["mode"]


def resolve_isolation(isolation: str) -> str:
    """The mode `isolation` runs in: "namespaces" or "none"; raises SandboxUnavailable when
    isolation is required ("auto", "namespaces") and namespaces do not work here."""
    if isolation not in ISOLATIONS:
        raise ValueError(f"isolation must be one of {ISOLATIONS}, got {isolation!r}")
    if isolation == "none":
        return "none"
    if available_isolation() == "none":
        raise SandboxUnavailable(
            f"sandbox: Linux namespaces do not work here ({_probed.get('why', '?')}); "
            "model-written code will not run unisolated unless you opt out by name with "
            "reward.sandbox_isolation: none (isolation='none')"
        )
    return "namespaces"


def _run(mode: str, files: dict[str, str | bytes], argv_tail: list[str], stdin: str, lim: Limits):
    run = PythonRun(files, argv_tail, stdin, lim, mode)
    try:
        return run.run()
    finally:
        run.close()


class PythonRun:
    """One program, its jail launched gated at construction (built while the caller finishes
    something else), run to its end by `run()`, ended by `close()`."""

    def __init__(self, files: dict[str, str | bytes], argv_tail: list[str], stdin: str, lim: Limits,
                 mode: str):  # fmt: skip
        self.data = stdin.encode()
        self.process = SandboxProcess(files, argv_tail, lim, mode, gated=True)
        try:
            self.process.launch()
        except BaseException:
            self.process.close()
            raise

    def run(self) -> SandboxResult:
        p = self.process
        p.wait_ready()
        p.go()
        if len(self.data) <= _PIPE_BUF:  # fits the pipe: written at once, no thread to start
            _feed(p.stdin, self.data)
            return p.finish()
        feeder = threading.Thread(target=_feed, args=(p.stdin, self.data), daemon=True)
        feeder.start()
        result = p.finish()
        feeder.join(timeout=1.0)
        return result

    def close(self) -> None:
        self.process.close()


def _feed(pipe, data: bytes) -> None:
    with contextlib.suppress(OSError, ValueError):  # the program stopped reading
        pipe.write(data)
        pipe.close()


def run_python(
    source: str,
    *,
    stdin: str = "",
    limits: Limits | None = None,
    isolation: str = "auto",
    extra_files: dict[str, str] | None = None,
) -> SandboxResult:
    """Run `source` as a Python program in the sandbox, its stdin a pipe fed with `stdin`.

    isolation: "auto" or "namespaces" (run isolated, or raise SandboxUnavailable), or "none"
    (the explicit opt-out). extra_files are written next to the program in its working
    directory. Raises SandboxError when the jail fails; whatever the program does is in the
    result.
    """
    return _run(resolve_isolation(isolation), {"main.py": source, **(extra_files or {})},
                ["main.py"], stdin, limits or Limits())  # fmt: skip
