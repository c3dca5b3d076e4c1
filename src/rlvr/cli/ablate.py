"""`rlvr ablate`: DAPO's cumulative ablation ladder, small and local
(docs/algorithms.md#the-dapo-ablation-ladder).

Every rung is the `grpo` preset with the KL term removed (algo.kl_coef 0) plus the DAPO
components of the rungs above it and one more:

    naive GRPO                    grpo preset, kl_coef 0
    + overlong filtering          algo.overlong_filter: truncated responses get no loss
    + clip-higher                 algo.clip_high 0.28 (clip_low stays 0.2)
    + soft overlong punishment    algo.soft_overlong: length penalty in the last overlong_cache
    + token-level loss            algo.agg token_mean
    + dynamic sampling (= DAPO)   algo.dynamic_sampling: only groups with 0 < #correct < G

reward.wrong_score is DAPO's -1 on every rung, naive GRPO included (the grpo preset alone
scores a wrong answer 0), so neighbouring rungs differ in the named component only; the top
rung is then the `dapo` preset. Each rung runs once per seed 0..N-1 with the same seeds (so
the prompts and the initial samples match across rungs), one after another, with periodic
held-out evaluation (train.eval_every, default steps/10). Then `ablation.md` (the table),
`ablation.json` (the numbers per run) and the PNG figures of `rlvr.cli.plot` are written,
including `entropy_clip_higher.png`: symmetric clipping against clip-higher on the same seeds.

Runs live in OUTPUT_DIR/runs/<i>-<rung>/seed<k>. Rerunning the same command resumes: a run
with summary.json is skipped, an interrupted one continues from its newest checkpoint (or
starts over when it has none); a run directory holding a different config is an error.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlvr.config.load import dump_yaml, load_config, parse_overrides, to_dict
from rlvr.config.schema import Config, ConfigError

SUMMARY = "DAPO's ablation ladder (naive GRPO ... DAPO) over seeds, with a report"


@dataclass(frozen=True)
class Rung:
    key: str
    label: str
    changes: dict[str, dict[str, Any]]


BASE: dict[str, dict[str, Any]] = {"algo": {"kl_coef": 0.0}, "reward": {"wrong_score": -1.0}}
RUNGS: tuple[Rung, ...] = (
    Rung("grpo", "naive GRPO", {}),
    Rung("overlong_filter", "+ overlong filtering", {"algo": {"overlong_filter": True}}),
    Rung("clip_higher", "+ clip-higher", {"algo": {"clip_high": 0.28}}),
    Rung("soft_overlong", "+ soft overlong punishment", {"algo": {"soft_overlong": True}}),
    Rung("token_mean", "+ token-level loss", {"algo": {"agg": "token_mean"}}),
    Rung("dynamic_sampling", "+ dynamic sampling (= DAPO)", {"algo": {"dynamic_sampling": True}}),
)
# Keys the ladder sets per rung or per run; overriding one would break the comparison.
FIXED = {(s, k) for r in RUNGS for s, kv in r.changes.items() for k in kv} | {
    ("train", "seed"),
    ("train", "output_dir"),
}
SYMMETRIC, CLIP_HIGHER = 1, 2  # the rungs the entropy figure compares


def _merge(*layers: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for layer in layers:
        for section, values in layer.items():
            out.setdefault(section, {}).update(values)
    return out


def rung_changes(index: int) -> dict[str, dict[str, Any]]:
    """Changes to the grpo preset for rung `index`: the base plus every component up to it."""
    return _merge(BASE, *(r.changes for r in RUNGS[: index + 1]))


def rung_config(
    index: int,
    seed: int,
    run_dir: Path,
    *,
    task: str | None = None,
    steps: int | None = None,
    overrides: dict[str, dict[str, Any]] | None = None,
) -> Config:
    overrides = overrides or {}
    bad = sorted(f"{s}.{k}" for s, kv in overrides.items() for k in kv if (s, k) in FIXED)
    if bad or "preset" in overrides:
        raise ConfigError(
            f"rlvr ablate: cannot override {', '.join(bad) or 'preset'}: the ladder sets it "
            f"(use --seeds, --output-dir; the rungs' components are fixed)"
        )
    run: dict[str, dict[str, Any]] = {"train": {"seed": seed, "output_dir": str(run_dir)}}
    if task is None and not {"task", "path"} & set(overrides.get("data", {})):
        task = "arithmetic"  # the built-in model's task; docs/ablation.md tightens the length cap
    if task:
        run["data"] = {"task": task}
    if steps is not None:
        run["train"]["max_steps"] = steps
    changes = _merge(rung_changes(index), overrides, run)
    cfg = load_config(None, changes, preset="grpo")
    if "eval_every" not in overrides.get("train", {}):  # ~10 points on the accuracy curve
        changes["train"]["eval_every"] = max(1, cfg.train.max_steps // 10)
        cfg = load_config(None, changes, preset="grpo")
    return cfg


def _run(cfg: Config, run_dir: Path, show_progress: bool, log) -> dict[str, Any] | None:
    """Train `cfg` in `run_dir` unless done; the summary, or None when stopped by a signal."""
    from rlvr.run.checkpoint import latest_good_checkpoint
    from rlvr.training.trainer import train

    summary, resume = run_dir / "summary.json", None
    if (run_dir / "config.yaml").is_file():
        if (run_dir / "config.yaml").read_text() != dump_yaml(cfg):
            raise ConfigError(
                f"{run_dir} holds a run with a different config; "
                f"choose another --output-dir or delete it"
            )
        if summary.is_file():
            log(f"  done already ({summary}), skipped")
            return json.loads(summary.read_text())
        if latest_good_checkpoint(run_dir, warn=log) is not None:
            resume = run_dir
        else:
            log(f"  {run_dir}: interrupted without a checkpoint, starting it over")
            shutil.rmtree(run_dir)
    train(cfg, resume_dir=resume, show_progress=show_progress)
    return json.loads(summary.read_text()) if summary.is_file() else None


def _fmt(values: list[float], digits: int = 3) -> str:
    if not values:
        return "-"
    mean = f"{statistics.mean(values):.{digits}f}"
    return f"{mean} ± {statistics.stdev(values):.{digits}f}" if len(values) > 1 else mean


def _last(run_dir: Path, key: str) -> float | None:
    from rlvr.cli.plot import load_run

    values = load_run(run_dir).series(key)
    return list(values.values())[-1] if values else None


def write_report(out_dir: Path, results: list[dict[str, Any]], command: str) -> Path:
    """ablation.md (table + figures) and ablation.json from the finished runs."""
    from rlvr.cli.plot import plot_runs

    (out_dir / "ablation.json").write_text(json.dumps(results, indent=2))
    cfg = results[0]["config"]
    seeds = sorted({r["seed"] for r in results})
    lines = [
        "# DAPO ablation ladder (docs/algorithms.md#the-dapo-ablation-ladder), small",
        "",
        f"Command: `{command}`",
        "",
        f"Task `{cfg['data']['task']}`, model `{cfg['model']['name_or_path']}`, seeds "
        f"{', '.join(map(str, seeds))}; {cfg['rollout']['prompts_per_step']} prompts x "
        f"{cfg['rollout']['group_size']} responses per step, max_new_tokens "
        f"{cfg['rollout']['max_new_tokens']}; held-out accuracy on {cfg['train']['eval_size']} "
        f"prompts x {cfg['train']['eval_samples']} samples, every "
        f"{cfg['train']['eval_every']} steps. Every rung: the grpo preset with algo.kl_coef 0 "
        f"and reward.wrong_score -1, plus the components of the rungs above it.",
        "",
        "| rung | adds | held-out accuracy before | final held-out accuracy | "
        "final truncation rate | seeds | steps | wall time per run (s) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for rung in RUNGS:
        rows = [r for r in results if r["rung"] == rung.key]
        if not rows:
            continue
        adds = ", ".join(
            f"{s}.{k}={json.dumps(v)}"
            for s, kv in (rung.changes or BASE).items()
            for k, v in kv.items()
        )
        trunc = [r["final_truncation_rate"] for r in rows if r["final_truncation_rate"] is not None]
        lines.append(
            f"| {rung.label} | {adds} | {_fmt([r['accuracy_before'] for r in rows])} | "
            f"{_fmt([r['accuracy_after'] for r in rows])} | {_fmt(trunc)} | {len(rows)} | "
            f"{_fmt([r['steps'] for r in rows], 0)} | {_fmt([r['wall_time_s'] for r in rows], 1)} |"
        )
    total = sum(r["wall_time_s"] for r in results)
    lines += [
        "",
        "Mean ± sample standard deviation over seeds (no ± with one seed). Final truncation "
        f"rate: the last training step's. Total training wall time {total:.0f} s (a resumed "
        "run counts its last part only).",
        "",
        "## Figures",
        "",
    ]
    run_dirs = [Path(r["run_dir"]) for r in results]
    labels = [next(g.label for g in RUNGS if g.key == r["rung"]) for r in results]
    for path in plot_runs(run_dirs, out_dir, labels=labels):
        lines.append(f"![{path.stem}]({path.name})")
    pair = (RUNGS[SYMMETRIC].key, RUNGS[CLIP_HIGHER].key)  # every seed ran both
    chosen = [i for i, r in enumerate(results) if r["rung"] in pair]
    if chosen:
        paths = plot_runs(
            [run_dirs[i] for i in chosen],
            out_dir,
            labels=[labels[i] for i in chosen],
            figures=["entropy", "clipping"],
            suffix="_clip_higher",
            title="Symmetric clipping (0.2/0.2) vs clip-higher (0.2/0.28), "
            f"seeds {', '.join(map(str, seeds))}",
        )
        lines += ["", "Symmetric clipping against clip-higher, same seeds:", ""]
        lines += [f"![{p.stem}]({p.name})" for p in paths]
    report = out_dir / "ablation.md"
    report.write_text("\n".join(lines) + "\n")
    return report


def run_ablation(
    out_dir: Path,
    *,
    task: str | None = None,
    seeds: int = 3,
    steps: int | None = None,
    overrides: dict[str, dict[str, Any]] | None = None,
    show_progress: bool = True,
    command: str = "rlvr ablate",
    log=print,
) -> Path | None:
    """Every rung x seed, in order; then the report. None when a run was stopped by a signal."""
    if seeds < 1:
        raise ConfigError(f"--seeds: got {seeds}, expected >= 1")
    out_dir = Path(out_dir)
    plan = [
        (i, seed, out_dir / "runs" / f"{i}-{rung.key}" / f"seed{seed}")
        for i, rung in enumerate(RUNGS)
        for seed in range(seeds)
    ]
    # every config first: a bad override fails before any training
    configs = [
        rung_config(i, s, d, task=task, steps=steps, overrides=overrides) for i, s, d in plan
    ]
    results = []
    for n, ((i, seed, run_dir), cfg) in enumerate(zip(plan, configs), start=1):
        log(f"[{n}/{len(plan)}] {RUNGS[i].label}, seed {seed}: {run_dir}")
        summary = _run(cfg, run_dir, show_progress, log)
        if summary is None:
            log(f"stopped; rerun the same command to continue ({out_dir})")
            return None
        results.append(
            {
                "rung": RUNGS[i].key,
                "seed": seed,
                "run_dir": str(run_dir),
                "accuracy_before": summary["eval_before"]["accuracy"],
                "accuracy_after": summary["eval_after"]["accuracy"],
                "final_truncation_rate": _last(run_dir, "response/truncation_rate"),
                "steps": summary["steps"],
                "wall_time_s": summary["wall_time_s"],
                "config": to_dict(cfg),
            }
        )
    return write_report(out_dir, results, command)


def run(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="rlvr ablate",
        description="DAPO's cumulative ablation ladder (naive GRPO, + overlong filtering, "
        "+ clip-higher, + soft overlong punishment, + token-level loss, + dynamic sampling) "
        "over N seeds, then ablation.md and figures. Further --section.key=value overrides "
        "apply to every rung. Rerun the same command to resume.",
    )
    p.add_argument("--task", help="built-in task (default arithmetic, the built-in model's)")
    p.add_argument("--seeds", type=int, default=3, help="seeds 0..N-1 per rung (default 3)")
    p.add_argument("--steps", type=int, help="rollout steps per run (train.max_steps)")
    p.add_argument("--output-dir", type=Path, help="default runs/ablate-<timestamp>")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    args, rest = p.parse_known_args(argv)
    out = args.output_dir or Path("runs") / time.strftime("ablate-%Y%m%d-%H%M%S")
    command = ["rlvr", "ablate", *argv, *([] if args.output_dir else ["--output-dir", str(out)])]
    report = run_ablation(
        out,
        task=args.task,
        seeds=args.seeds,
        steps=args.steps,
        overrides=parse_overrides(rest),
        show_progress=not args.no_progress,
        command=" ".join(command),
    )
    if report is None:
        return 130
    print(f"report: {report}")
    sys.stdout.write(report.read_text())
    return 0
