"""Child process that runs math-verify for `rlvr.rewards.math.math_equal`.

Started by path with `python -I _verify_worker.py TRAINER_PID`, so it imports nothing of
rlvr. It dies with the trainer, even when the trainer is SIGKILLed while sympy holds the GIL
in C for minutes (`_lifeline.die_with`). Protocol: one JSON object per line on stdin,
{"p": prediction, "r": reference}; one JSON line back, {"ok": bool} or {"error": str}. The
parent kills this process when a call runs past its time limit (sympy can spend minutes in
C on `10^{10^{10}}`, where a signal-based timeout cannot interrupt it), so nothing here
needs a timeout of its own.
"""

import importlib.util
import json
import resource
import sys
import warnings
from pathlib import Path

if len(sys.argv) > 1:  # _lifeline.die_with, loaded by path: -I puts no directory on sys.path
    _path = Path(__file__).with_name("_lifeline.py")
    _spec = importlib.util.spec_from_file_location("_lifeline", _path)
    _lifeline = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(_lifeline)
    _lifeline.die_with(int(sys.argv[1]))

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
