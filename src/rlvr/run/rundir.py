"""The run directory: created once, never overwritten by a new run, trimmed on resume."""

from __future__ import annotations

import json
import time
from pathlib import Path

from rlvr.config import Config, ConfigError, dump_yaml


def prepare_run_dir(cfg: Config, resume: bool) -> Path:
    if cfg.train.output_dir:
        run_dir = Path(cfg.train.output_dir)
    else:
        run_dir = Path("runs") / time.strftime("%Y%m%d-%H%M%S")
    if not resume and (run_dir / "metrics.jsonl").exists():
        raise ConfigError(
            f"train.output_dir: {run_dir} already holds a run; resume it with "
            f"`rlvr train --resume {run_dir}` or choose another --output-dir"
        )
    run_dir.mkdir(parents=True, exist_ok=True)
    if not resume:
        (run_dir / "config.yaml").write_text(dump_yaml(cfg))
    return run_dir


def truncate_jsonl(path: Path, last_step: int) -> None:
    """Drop lines written after the checkpoint being resumed (they will be written again)."""
    if not path.exists():
        return
    keep = [
        line
        for line in path.read_text().splitlines()
        if line.strip() and json.loads(line).get("step", 0) <= last_step
    ]
    path.write_text("".join(line + "\n" for line in keep))
