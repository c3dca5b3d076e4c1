"""Child process that runs math-verify for `rlvr.rewards.math.math_equal`.

Started by path with `python -I _verify_worker.py TRAINER_PID`, so it imports nothing of
rlvr. It dies with the trainer, even when the trainer is SIGKILLed while sympy holds the GIL
in C for minutes: a watchdog process forked first waits on the trainer's pidfd and then
SIGKILLs this one (and a parent-death signal ends the watchdog with this process).
Protocol: one JSON object per line on stdin, {"p": prediction, "r": reference}; one JSON
line back, {"ok": bool} or {"error": str}. The parent kills this process when a call runs past its time limit (sympy can
spend minutes in C on `10^{10^{10}}`, where a signal-based timeout cannot interrupt it), so
nothing here needs a timeout of its own.
"""

import ctypes
import json
import os
import resource
import select
import signal
import sys
import time
import warnings


def _watchdog(trainer: int) -> None:
    """Fork a process that SIGKILLs this one when `trainer` exits."""
    worker = os.getpid()
    if os.fork():
        return
    os.closerange(0, 3)  # the worker's pipes stay the worker's alone
    ctypes.CDLL(None).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG: die with the worker
    if os.getppid() != worker:
        os._exit(0)
    try:
        select.select([os.pidfd_open(trainer)], [], [])
    except (AttributeError, OSError):  # no pidfd (Linux < 5.3): poll
        while os.getppid() == worker and _alive(trainer):
            time.sleep(0.2)
    os.kill(worker, signal.SIGKILL)
    os._exit(0)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


if len(sys.argv) > 1:
    _watchdog(int(sys.argv[1]))

# A runaway expression fails with MemoryError instead of taking the machine's memory.
_AS_LIMIT = 4 * 1024**3
resource.setrlimit(resource.RLIMIT_AS, (_AS_LIMIT, _AS_LIMIT))
warnings.filterwarnings("ignore")

from math_verify import parse, verify  # noqa: E402


def _parse(text: str):
    # \boxed{} lets math-verify's LaTeX extractor take the whole answer; the plain-expression
    # extractor is its fallback for answers like "1/2".
    return parse("\\boxed{" + text + "}", parsing_timeout=None)


def main() -> None:
    sys.stdout.write('{"ready": true}\n')
    sys.stdout.flush()
    for line in sys.stdin:
        try:
            req = json.loads(line)
            gold, pred = _parse(req["r"]), _parse(req["p"])
            ok = bool(gold and pred and verify(gold, pred, timeout_seconds=None))
            out = {"ok": ok}
        except Exception as e:  # a parse failure is "not equal", reported for the log
            out = {"error": f"{type(e).__name__}: {str(e)[:200]}"}
        sys.stdout.write(json.dumps(out) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
