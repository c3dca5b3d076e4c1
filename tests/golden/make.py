"""Write tests/golden/golden.json from the code as it is: the policy loss, one update and a
2-step run of each preset (tests/golden/golden_cases.py), prompt sharing off and on, and a 2-rank
run. tests/test_golden.py recomputes them and compares.

    PYTHONPATH=src:tests python tests/golden/make.py            # all levels (minutes)
    PYTHONPATH=src:tests python tests/golden/make.py loss update  # some of them
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import golden_cases as cases
import torch

torch.set_num_threads(2)  # the suite's (tests/conftest.py): the bits depend on it


def main(levels: list[str]) -> None:
    path = cases.HERE / "golden.json"
    out = json.loads(path.read_text()) if path.exists() else {}
    out["environment"] = cases.environment()
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = cases.tiny_model_dir(Path(tmp))
        makers = {
            "loss": cases.loss_cases,
            "update": cases.update_cases,
            "run": lambda: cases.run_cases(model_dir),
            "run2": lambda: {"dapo/share=0": cases.run_case(model_dir, "dapo", False, nproc=2)},
        }
        for level in levels or list(makers):
            out[level] = makers[level]()
            print(level, len(out[level]), "cases", flush=True)
    path.write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
