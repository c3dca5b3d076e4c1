"""A run's config as stored in its run directory: local paths made absolute so that
`--resume RUN_DIR` works from any directory, the keys a resumed run may change, the check of
config.yaml against the record each checkpoint holds of the config it was trained with, and
the code a run directory's config names (imported only when the user names it again or
passes --trust-run-code)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from rlvr.config.load import apply_changes, flat_keys, load_config, to_dict
from rlvr.config.schema import Config, ConfigError

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
    # where the vLLM servers run and how long one may stay silent (the weights and seeds
    # they sample with are the run's)
    ("rollout", "vllm.urls"),
    ("rollout", "vllm.launch"),
    ("rollout", "vllm.cpus"),
    ("rollout", "vllm.gpus"),
    ("rollout", "vllm.timeout"),
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
        env=dataclasses.replace(
            cfg.env,
            agent=cfg.env.agent and absolute_spec(cfg.env.agent),
            environment=cfg.env.environment and _absolute_environment(cfg.env.environment),
        ),
    )


def _absolute_environment(spec: str) -> str:
    """env.environment "KIND:TARGET" with a file TARGET's path made absolute."""
    kind, sep, target = spec.partition(":")
    return f"{kind}{sep}{absolute_spec(target)}" if sep else spec


def stored_config(run_dir: Path) -> Config:
    path = run_dir / "config.yaml"
    if not path.is_file():
        raise ConfigError(f"resume: {run_dir} holds no config.yaml (not a run directory)")
    return load_config(path)


def check_resume_changes(stored: Config, new: Config) -> None:
    """Refuse a resumed run whose config differs from the stored one in a key that changes
    the math (everything but RESUME_SAFE), naming the keys."""
    a, b = _flat(to_dict(stored)), _flat(to_dict(new))
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


def config_differences(trained: dict, now: dict) -> list[str]:
    """ "section.key (A -> B)" for each key outside RESUME_SAFE (and train.output_dir) where
    config dict `now` differs from `trained` (both as `to_dict` writes them; an engine's
    section key by key, `rollout.vllm.dtype`, and a record's old key names as the new). A key
    the record lacks (a checkpoint saved before the key existed) differs only where `now`
    holds something other than the key's default, the behaviour of the code that saved it."""
    out = []
    trained, now, default = _flat(trained), _flat(now), _flat(to_dict(Config()))
    if trained.get("preset") != now.get("preset"):
        out.append(f"preset ({trained.get('preset')!r} -> {now.get('preset')!r})")
    for s, section in now.items():
        if not isinstance(section, dict):
            continue
        old = trained.get(s) if isinstance(trained.get(s), dict) else {}
        for k, v in section.items():
            if (s, k) in RESUME_SAFE or (s, k) == ("train", "output_dir"):
                continue
            if k not in old and _plain(default.get(s, {}).get(k, _MISSING)) == _plain(v):
                continue
            if k not in old or _plain(old[k]) != _plain(v):
                was = repr(old[k]) if k in old else "absent"
                out.append(f"{s}.{k} ({_short(was)} -> {_short(repr(v))})")
    return out


_MISSING = object()


def _flat(config: dict) -> dict:
    """A `to_dict` config with every section's keys as `flat_keys` spells them."""
    return {s: flat_keys(s, v) if isinstance(v, dict) else v for s, v in config.items()}


def _plain(v):
    return list(map(_plain, v)) if isinstance(v, (list, tuple)) else v


def _short(text: str, n: int = 60) -> str:
    return text if len(text) <= n else text[: n - 3] + "..."


def check_trained_with(state: dict, cfg: Config, checkpoint: Path) -> None:
    """Refuse to resume from `checkpoint` unless the config it was trained with (the record
    its trainer state holds) gives the same math as `cfg` (the run directory's config.yaml
    with the command line's resume-safe keys): a hand-edited or emptied config.yaml is named,
    key by key, instead of silently changing the steps still to come."""
    trained = state.get("config")
    where = f"resume: {checkpoint.parent.parent}"
    if not isinstance(trained, dict):
        raise ConfigError(
            f"{where}: checkpoint {checkpoint.name} holds no record of the config it was "
            "trained with, so config.yaml cannot be checked; start a new run from its weights "
            f"(--model.name_or_path={checkpoint})"
        )
    changed = config_differences(trained, to_dict(cfg))
    if changed:
        more = f" and {len(changed) - 8} more" if len(changed) > 8 else ""
        raise ConfigError(
            f"{where}: config.yaml differs from what {checkpoint.name} was trained with in "
            f"{'; '.join(changed[:8])}{more}; restore config.yaml (only "
            f"{', '.join(f'{s}.{k}' for s, k in sorted(RESUME_SAFE))} may change on resume)"
        )


# Keys whose values name code to import ("module:function", "path/file.py:function").
CODE_KEYS = (
    ("reward", "accuracy"),
    ("reward", "extra"),
    ("rollout", "tools"),
    ("algo", "loss"),
    ("env", "agent"),
    ("env", "environment"),
)


def run_code(cfg: Config) -> list[str]:
    """The code `cfg` imports, in order: reward, tool, objective and agent specs holding ":"
    (built-in reward, tool and objective names hold none)."""
    r = cfg.reward
    specs = [r.accuracy, *(e.rsplit("=", 1)[0] for e in r.extra), *cfg.rollout.tools]
    specs += [cfg.algo.loss, cfg.env.agent or "", cfg.env.environment or ""]
    return list(dict.fromkeys(s for s in specs if ":" in s))


def code_overrides(overrides: dict) -> dict:
    """The CODE_KEYS of command-line `overrides`, as {section: {key: value}}."""
    out: dict = {}
    for s, k in CODE_KEYS:
        if k in overrides.get(s, {}):
            out.setdefault(s, {})[k] = overrides[s][k]
    return out


def pop_code_overrides(overrides: dict) -> dict:
    """`code_overrides(overrides)`, then taken out of `overrides`: on resume they say which
    of the run's code may be imported (`check_run_code`), they change nothing."""
    code = code_overrides(overrides)
    for s, k in CODE_KEYS:
        overrides.get(s, {}).pop(k, None)
    for s in [s for s, kv in overrides.items() if isinstance(kv, dict) and not kv]:
        del overrides[s]
    return code


def check_run_code(cfg: Config, given: dict, trust: bool, where: str) -> str | None:
    """The line that says which code the run directory's config (`cfg`) makes this process
    import, or None when it names none. `given`: the CODE_KEYS named on the command line
    (`code_overrides`); each must equal the config's value (paths made absolute). Raises
    ConfigError when the config names code that is neither named again nor allowed by
    `trust` (--trust-run-code), or when a named key differs from the config's."""
    named_cfg = resolve_paths(apply_changes(Config(), given, "command line"))
    for s, kv in given.items():
        for k in kv:
            was, now = getattr(getattr(cfg, s), k), getattr(getattr(named_cfg, s), k)
            if _plain(was) != _plain(now):
                raise ConfigError(
                    f"{where}: {s}.{k} is {_short(repr(now), 200)} on the command line but "
                    f"{_short(repr(was), 200)} in its config.yaml; a run's rewards, tools and "
                    "objective cannot change on resume (name them as the run was started)"
                )
    code, named = run_code(cfg), run_code(named_cfg)
    if not code:
        return None
    if trust:
        return f"{where}: importing the code its config.yaml names (--trust-run-code): {', '.join(code)}"
    unnamed = [c for c in code if c not in named]
    if unnamed:
        raise ConfigError(
            f"{where}: its config.yaml names code to import: {', '.join(unnamed)}; a run "
            "directory's code runs only when you name it again (--reward.extra=..., "
            "--reward.accuracy=..., --rollout.tools=..., --algo.loss=..., --agent ..., --env ... "
            "as the run was started) or pass --trust-run-code"
        )
    return f"{where}: importing {', '.join(code)} (named on the command line)"
