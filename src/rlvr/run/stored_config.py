"""A run's config as stored in its run directory: local paths made absolute so that
`--resume RUN_DIR` works from any directory, and the keys a resumed run may change."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from rlvr.config import Config, ConfigError, load_config, to_dict

# Keys a resumed run may change: none of them changes the math of the steps still to come.
RESUME_SAFE = {
    ("train", "max_steps"),
    ("train", "save_every"),
    ("train", "keep_checkpoints"),
    ("train", "log_samples"),
    ("train", "log_every"),
    ("train", "threads"),
    ("train", "eval_every"),
    ("reward", "python_path"),  # where the same modules are imported from
}


def absolute_spec(spec: str) -> str:
    """A reward named by file ("path/f.py:fn") with the path made absolute; others as given."""
    target, sep, attr = spec.rpartition(":")
    if sep and (target.endswith(".py") or "/" in target) and Path(target).expanduser().exists():
        return f"{Path(target).expanduser().resolve()}:{attr}"
    return spec


def resolve_paths(cfg: Config) -> Config:
    """`cfg` with every local path absolute (data files, a local model directory, the run
    directory, reward files), so the run's config.yaml resumes from any directory."""

    def local(value: str | None) -> str | None:
        if value is None:
            return None
        path = Path(value).expanduser()
        return str(path.resolve()) if path.exists() else value

    d, m, r, t = cfg.data, cfg.model, cfg.reward, cfg.train
    extra = tuple(f"{absolute_spec(name)}={w}" for name, w in (e.rsplit("=", 1) for e in r.extra))
    params = {absolute_spec(k): v for k, v in r.params.items()}
    accuracy = r.accuracy if r.accuracy == "task" else absolute_spec(r.accuracy)
    output = str(Path(t.output_dir).expanduser().resolve()) if t.output_dir else None
    return dataclasses.replace(
        cfg,
        data=dataclasses.replace(d, path=local(d.path), eval_path=local(d.eval_path)),
        model=dataclasses.replace(m, name_or_path=local(m.name_or_path)),
        reward=dataclasses.replace(
            r, accuracy=accuracy, extra=extra, params=params, model=local(r.model)
        ),
        train=dataclasses.replace(t, output_dir=output),
    )


def stored_config(run_dir: Path) -> Config:
    path = run_dir / "config.yaml"
    if not path.is_file():
        raise ConfigError(f"resume: {run_dir} holds no config.yaml (not a run directory)")
    return load_config(path)


def check_resume_changes(stored: Config, new: Config) -> None:
    """Refuse a resumed run whose config differs from the stored one in a key that changes
    the math (everything but RESUME_SAFE), naming the keys."""
    a, b = to_dict(stored), to_dict(new)
    bad = [
        f"{s}.{k}"
        for s in b
        if isinstance(b[s], dict)
        for k in b[s]
        if (s, k) not in RESUME_SAFE and (s, k) != ("train", "output_dir") and a[s][k] != b[s][k]
    ]
    if a["preset"] != b["preset"]:
        bad.insert(0, "preset")
    if bad:
        raise ConfigError(
            f"resume: cannot change {', '.join(bad)} (it would change the run's math); "
            f"allowed: {', '.join(f'{s}.{k}' for s, k in sorted(RESUME_SAFE))}"
        )
