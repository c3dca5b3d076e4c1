"""Rule-labelled responses: what a reward model trains and is measured on."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from rlvr.run.private import open_private, private_dir


@dataclass(frozen=True)
class Record:
    """One sampled response. `prompt`: the prompt as the policy continued it (chat template
    included); `response`: the decoded response without its EOS; `correct`: the rule's
    verdict; `well_formed`: whether it passes the format check; `group`: responses to the same
    prompt share it (Bradley-Terry pairs are formed within a group). The reference answer is
    not kept: the reward model never sees it."""

    prompt: str
    response: str
    correct: bool
    well_formed: bool
    group: int


def write_records(path: Path, records: list[Record]) -> None:
    """Write the jsonl file whole or not at all (a temporary name, then a rename)."""
    private_dir(path.parent)
    tmp = path.with_name(f".{path.name}.tmp")
    with open_private(tmp, "w") as f:
        for r in records:
            f.write(json.dumps(asdict(r)) + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def read_records(path: Path) -> list[Record]:
    out = []
    for i, line in enumerate(Path(path).read_text().splitlines(), 1):
        try:
            out.append(Record(**json.loads(line)))
        except (ValueError, TypeError) as e:
            raise ValueError(f"{path}:{i}: not a response record ({e})") from None
    return out
