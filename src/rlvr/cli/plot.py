"""`rlvr plot RUN_DIR [RUN_DIR ...]`: training curves from each run's metrics.jsonl, as PNGs.

Figures, every panel against the rollout step: reward_accuracy (training reward; held-out
accuracy: summary.json's eval_before at step 0, `eval/accuracy` every train.eval_every steps,
eval_after at the end), entropy, length (mean length; truncation rate), clipping (tokens
clipped at 1 - eps_low / 1 + eps_high), groups (all-correct / all-wrong fraction). Runs whose
config.yaml files are equal except for train.seed and train.output_dir form a group, drawn as
its mean with a min-max band; other runs are a line each. matplotlib's Agg canvas is used
directly (no pyplot, no display, no global state), and only when drawing.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import yaml

from rlvr.config.safe_yaml import load_yaml

SUMMARY = "training curves (PNG) from run directories"

if TYPE_CHECKING:
    from matplotlib.figure import Figure

STEP_LABEL = "rollout step"


class PlotError(ValueError):
    """A run directory's files cannot be read; the message names the file (and line)."""


@dataclass(frozen=True)
class Panel:
    figure: str
    key: str  # metrics.jsonl key
    ylabel: str
    title: str


TITLES = {
    "reward_accuracy": "Reward and held-out accuracy",
    "entropy": "Policy entropy",
    "length": "Response length and truncation",
    "clipping": "Clipped tokens",
    "groups": "Groups without a learning signal",
}
PANELS = (
    Panel("reward_accuracy", "reward/mean", "mean reward", "training reward"),
    Panel("reward_accuracy", "eval/accuracy", "accuracy", "held-out accuracy"),
    Panel("entropy", "entropy", "mean token entropy (nats)", "entropy of the sampled tokens"),
    Panel("length", "response/length_mean", "tokens", "mean response length"),
    Panel("length", "response/truncation_rate", "fraction of responses", "truncated (no EOS)"),
    Panel("clipping", "clip_frac_low", "fraction of tokens", "clipped at 1 - eps_low (A < 0)"),
    Panel("clipping", "clip_frac_high", "fraction of tokens", "clipped at 1 + eps_high (A > 0)"),
    Panel("groups", "groups/all_correct_frac", "fraction of groups", "all responses correct"),
    Panel("groups", "groups/all_wrong_frac", "fraction of groups", "all responses wrong"),
)


def _number(v: Any) -> float | None:
    """A finite float, or None (missing, NaN/inf, which metrics.jsonl writes as strings)."""
    if isinstance(v, bool):
        return None
    try:
        x = float(v)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


@dataclass
class Run:
    path: Path
    rows: list[dict[str, Any]]
    config: dict[str, Any] | None
    summary: dict[str, Any] | None

    def series(self, key: str) -> dict[int, float]:
        """step -> value of `key`; held-out accuracy also gets summary.json's before/after."""
        out = {}
        for row in self.rows:
            x = _number(row.get(key))
            if x is not None:
                out[int(row["step"])] = x
        if key == "eval/accuracy" and self.summary:
            before = _number((self.summary.get("eval_before") or {}).get("accuracy"))
            after = _number((self.summary.get("eval_after") or {}).get("accuracy"))
            if before is not None:
                out.setdefault(0, before)
            if after is not None and isinstance(self.summary.get("steps"), int):
                out.setdefault(self.summary["steps"], after)
        return dict(sorted(out.items()))


def _read_optional(path: Path, parse) -> Any:
    if not path.is_file():
        return None
    try:
        return parse(path.read_text())
    except (ValueError, yaml.YAMLError) as e:
        raise PlotError(f"{path}: cannot be parsed ({e})") from None


def load_run(run_dir: Path) -> Run:
    """Read one run directory; errors name the directory, file and line."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise FileNotFoundError(f"{run_dir}: no such run directory")
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        raise FileNotFoundError(
            f"{run_dir}: no metrics.jsonl (not a run directory written by `rlvr train`?)"
        )
    rows = []
    for n, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise PlotError(f"{path}, line {n}: not valid JSON ({e.msg})") from None
        if not isinstance(row, dict) or not isinstance(row.get("step"), int):
            raise PlotError(f'{path}, line {n}: expected a JSON object with an integer "step"')
        if rows and row["step"] <= rows[-1]["step"]:
            raise PlotError(
                f"{path}, line {n}: step {row['step']} after step {rows[-1]['step']}; steps must "
                "increase one line each (the file was edited or damaged)"
            )
        rows.append(row)
    if not rows:
        raise PlotError(f"{path}: no steps logged")
    config = _read_optional(run_dir / "config.yaml", lambda text: load_yaml(text, "config.yaml"))
    summary = _read_optional(run_dir / "summary.json", json.loads)
    return Run(run_dir, rows, config if isinstance(config, dict) else None, summary)


@dataclass
class Group:
    label: str
    runs: list[Run]


def _flatten(config: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for section, values in config.items():
        if isinstance(values, dict):
            out.update({f"{section}.{k}": v for k, v in values.items()})
        else:
            out[section] = values
    return out


def _config_key(run: Run) -> str:
    if run.config is None:  # no config: a group of its own
        return f"dir:{run.path.resolve()}"
    flat = _flatten(run.config)
    for key in ("train.seed", "train.output_dir"):
        flat.pop(key, None)
    return json.dumps(flat, sort_keys=True, default=str)


def group_runs(runs: list[Run], labels: list[str] | None = None) -> list[Group]:
    """Runs sharing a config (up to seed and output dir) form one group, in first-seen order.
    Labels: the caller's (first run of each group), else the run directory's name for a single
    run, else the config keys that tell the groups apart."""
    if labels is not None and len(labels) != len(runs):
        raise PlotError(f"{len(labels)} labels given for {len(runs)} runs")
    keyed: dict[str, list[int]] = {}
    for i, run in enumerate(runs):
        keyed.setdefault(_config_key(run), []).append(i)
    names = [r.path.name for r in runs]
    if len(set(names)) < len(names):  # e.g. .../grpo/seed0 and .../dapo/seed0
        names = [f"{r.path.parent.name}/{r.path.name}" for r in runs]
    flats = [_flatten(runs[idx[0]].config or {}) for idx in keyed.values()]
    varying = [
        k
        for k in sorted(set().union(*flats))
        if k not in ("train.seed", "train.output_dir") and len({repr(f.get(k)) for f in flats}) > 1
    ]
    groups = []
    for idx, flat in zip(keyed.values(), flats):
        if labels is not None:
            label = labels[idx[0]]
        elif len(idx) == 1:
            label = names[idx[0]]
        else:
            parts = [f"{k.split('.', 1)[-1]}={flat.get(k)}" for k in varying[:3]]
            label = ", ".join(parts) or str(flat.get("preset") or names[idx[0]])
        if len(idx) > 1:
            label += f" (mean of {len(idx)}, min-max band)"
        groups.append(Group(label, [runs[i] for i in idx]))
    return groups


def aggregate(runs: list[Run], key: str) -> tuple[np.ndarray, ...]:
    """steps, mean, min, max of `key` over the runs that logged it at each step."""
    per_run = [run.series(key) for run in runs]
    steps = sorted(set().union(*per_run))
    values = [[s[step] for s in per_run if step in s] for step in steps]
    return (
        np.array(steps, dtype=float),
        np.array([np.mean(v) for v in values]),
        np.array([np.min(v) for v in values]),
        np.array([np.max(v) for v in values]),
    )


def build_figure(groups: list[Group], name: str, title: str | None = None) -> Figure:
    """One figure of TITLES, every group drawn on each of its panels."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # imported here: `rlvr train`
    from matplotlib.figure import Figure  # need not load matplotlib
    from matplotlib.ticker import MaxNLocator

    panels = [p for p in PANELS if p.figure == name]
    fig = Figure(figsize=(6.0 * len(panels), 4.2), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    for ax, panel in zip(axes, panels):
        drawn = False
        for i, group in enumerate(groups):
            steps, mean, lo, hi = aggregate(group.runs, panel.key)
            if not len(steps):
                continue
            color = f"C{i % 10}"
            sparse = panel.key.startswith("eval/") or len(steps) < 20
            ax.plot(steps, mean, color=color, label=group.label, marker="o" if sparse else None)
            if len(group.runs) > 1:
                ax.fill_between(steps, lo, hi, color=color, alpha=0.2, linewidth=0)
            drawn = True
        if drawn:
            ax.legend(fontsize="small")
        else:
            ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.ticklabel_format(axis="y", useOffset=False)
        ax.set_xlabel(STEP_LABEL)
        ax.set_ylabel(panel.ylabel)
        ax.set_title(panel.title)
        ax.grid(alpha=0.3)
    fig.suptitle(title or TITLES[name])
    return fig


def build_figures(
    groups: list[Group], figures: list[str] | None = None, title: str | None = None
) -> dict[str, Figure]:
    unknown = [f for f in figures or [] if f not in TITLES]
    if unknown:
        raise PlotError(f"unknown figure(s) {', '.join(unknown)}; valid: {', '.join(TITLES)}")
    return {name: build_figure(groups, name, title) for name in figures or TITLES}


def plot_runs(
    run_dirs: list[Path],
    out_dir: Path,
    *,
    labels: list[str] | None = None,
    figures: list[str] | None = None,
    suffix: str = "",
    title: str | None = None,
) -> list[Path]:
    """Draw the run directories' curves into `out_dir`/<figure><suffix>.png; returns the paths."""
    if not run_dirs:
        raise PlotError("no run directories given")
    groups = group_runs([load_run(Path(d)) for d in run_dirs], labels)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    figs = build_figures(groups, figures, title)
    for name, fig in figs.items():
        fig.savefig(out_dir / f"{name}{suffix}.png", dpi=110)
    return [out_dir / f"{name}{suffix}.png" for name in figs]


def run(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="rlvr plot",
        description="Draw training curves (reward, held-out accuracy, entropy, length, "
        "truncation, clipping, all-correct/all-wrong groups) from run directories. Runs that "
        "share a config apart from the seed are drawn as a mean with a min-max band.",
    )
    p.add_argument("run_dirs", nargs="+", type=Path, metavar="RUN_DIR")
    p.add_argument(
        "--output-dir",
        type=Path,
        help="where the PNGs go (default: RUN_DIR/plots for one run, ./plots for several)",
    )
    p.add_argument(
        "--label", action="append", help="legend label, once per RUN_DIR in order (optional)"
    )
    args = p.parse_args(argv)
    out = args.output_dir or (args.run_dirs[0] / "plots" if len(args.run_dirs) == 1 else "plots")
    try:
        paths = plot_runs(args.run_dirs, Path(out), labels=args.label)
    except PlotError as e:
        sys.stderr.write(f"error: {e}\n")
        return 2
    for path in paths:
        print(path)
    return 0
