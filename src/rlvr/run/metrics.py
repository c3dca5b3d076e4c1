"""Per-step metrics: metrics.jsonl (one JSON object per step), samples.jsonl, TensorBoard,
and a rich progress bar. Only the writing lives here; the trainer computes the numbers.

Where no live bar shows (stderr not a terminal, or no progress asked), the bar's line is
printed as plain text every `train.log_every` steps and at the last step.

Sample completions (prompt, completion, answer, reward) go to samples.jsonl, to TensorBoard
as a text table per step (tag `samples`), and to W&B / trackio as a table when enabled. At
the end of the run, reward failures scored 0 (`reward.on_error=zero`) are totalled on screen.
"""

from __future__ import annotations

import importlib
import json
import math
import threading
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from rlvr.run.private import narrow, open_private, private_dir


def _clean(v: Any) -> Any:
    """JSON has no NaN/inf: write them as strings so a bad step is visible, not a parse error."""
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    return v


class RunLogger:
    """Appends to the run directory's jsonl files; each line is flushed when written, so a
    crash loses at most the step in flight."""

    def __init__(
        self,
        run_dir: Path,
        *,
        total_steps: int,
        console: Console | None = None,
        tensorboard: bool = True,
        show_progress: bool = True,
        log_every: int = 10,
        report_to: tuple[str, ...] = (),
        project: str = "rlvr",
        config: dict[str, Any] | None = None,
    ):
        self.run_dir = run_dir
        self.console = console or Console(stderr=True, soft_wrap=True)
        # closed in close(); created 0600, as everything in the run directory (run/private.py)
        self._metrics = open_private(run_dir / "metrics.jsonl", "a")
        self._samples = open_private(run_dir / "samples.jsonl", "a")
        self._tb = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self._tb = SummaryWriter(str(private_dir(run_dir / "tensorboard")))
                _quiet_tensorboard_thread()
                self._tensorboard("flush")  # its event file exists from here: narrowed now
                narrow(run_dir / "tensorboard")
            except ImportError:
                self.console.print("[yellow]tensorboard not installed: no TensorBoard logs")
        # wandb and trackio share one module-level API: init, log(step=), finish.
        self._trackers = []
        for name in report_to:
            module = importlib.import_module(name)
            extra = {"dir": str(run_dir)} if name == "wandb" else {}
            if name == "wandb":  # it writes under run_dir/wandb: 0700, no other user enters
                private_dir(run_dir / "wandb")
            module.init(project=project, name=run_dir.name, config=config or {}, **extra)
            self._trackers.append(module)
        # rich draws no live bar where the console is not a terminal: plain lines instead
        live = show_progress and self.console.is_terminal
        self.progress = Progress(
            TextColumn("[bold]step"),
            MofNCompleteColumn(),
            BarColumn(),
            TextColumn("{task.fields[info]}"),
            TimeRemainingColumn(),
            console=self.console,
            disable=not live,
            transient=False,
        )
        self._task = self.progress.add_task("train", total=total_steps, info="")
        self.log_every, self.total_steps = (0 if live else log_every), total_steps
        self._start = time.time()
        self._failures: dict[str, float] = {}  # reward name -> samples scored 0, whole run
        self._responses = 0.0

    def __enter__(self) -> RunLogger:
        self.progress.start()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        row = {"step": step, **{k: _clean(v) for k, v in metrics.items()}}
        try:
            self._metrics.write(json.dumps(row) + "\n")
            self._metrics.flush()
        except OSError as e:  # a full disk, a quota: named, for the one-line error
            raise OSError(e.errno, e.strerror, str(self.run_dir / "metrics.jsonl")) from None
        numbers = {
            k: v
            for k, v in metrics.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool)
        }
        for k, v in numbers.items():
            self._tensorboard("add_scalar", k, v, step)
        for tracker in self._trackers:
            tracker.log(numbers, step=step)
        self._responses += metrics.get("responses", 0)
        for k, v in numbers.items():
            if k.startswith("failures/"):
                name = k.split("/", 1)[1]
                self._failures[name] = self._failures.get(name, 0.0) + v
        trained = (
            f"ent {metrics['entropy']:.3f}"
            if "entropy" in metrics
            else f"no update ({metrics.get('update/skip_reason', 'nothing kept')})"
        )
        info = (
            f"reward {metrics.get('reward/mean', 0):+.3f}  acc {metrics.get('accuracy', 0):.3f}"
            f"  {trained}  tok/s {metrics.get('tokens_per_s', 0):.0f}"
        )
        if "eval/accuracy" in metrics:
            info += f"  eval {metrics['eval/accuracy']:.3f}"
        self.progress.update(self._task, completed=step, info=info)
        if self.log_every and (step % self.log_every == 0 or step == self.total_steps):
            elapsed = time.time() - self._start
            self.progress.console.print(
                f"step {step}/{self.total_steps}  {info}  {elapsed:.0f} s", markup=False
            )

    def samples(self, step: int, rows: list[dict[str, Any]]) -> None:
        for r in rows:
            self._samples.write(json.dumps({"step": step, **r}) + "\n")
        self._samples.flush()
        if not rows:
            return
        if self._tb is not None:
            self._tensorboard("add_text", "samples", samples_markdown(rows), step)
        for tracker in self._trackers:
            table = getattr(tracker, "Table", None)
            if table is not None:
                data = [[r.get(c) for c in SAMPLE_COLUMNS] for r in rows]
                tracker.log({"samples": table(columns=list(SAMPLE_COLUMNS), data=data)}, step=step)

    def _tensorboard(self, method: str, *args) -> None:
        """A TensorBoard write; a failure (a full disk, a removed directory) stops TensorBoard
        logging with one warning instead of the run: metrics.jsonl holds every step."""
        if self._tb is None:
            return
        try:
            getattr(self._tb, method)(*args)
        except Exception as e:
            self._tb = None
            self.console.print(
                f"warning: TensorBoard logging stopped ({e}); metrics.jsonl has every step"
            )

    def message(self, text: str) -> None:
        self.progress.console.print(text)

    def close(self) -> None:
        failed = {k: v for k, v in self._failures.items() if v}
        if failed:
            of = f" of {self._responses:.0f} responses" if self._responses else ""
            parts = ", ".join(f"{k!r} {v:.0f}" for k, v in failed.items())
            self.progress.console.print(
                f"[yellow]reward failures over the run, scored 0 (reward.on_error=zero): "
                f"{parts}{of}; samples.jsonl and the step metrics failures/* show where"
            )
            self._failures = {}
        self.progress.stop()
        for f in (self._metrics, self._samples):
            if not f.closed:
                f.close()
        self._tensorboard("close")
        if self._tb is not None:  # anything the writer created after the first flush
            narrow(self.run_dir / "tensorboard")
        self._tb = None
        for tracker in self._trackers:
            tracker.finish()
        self._trackers = []


SAMPLE_COLUMNS = ("prompt", "completion", "answer", "reward", "correct", "length")


def _cell(value: Any) -> str:
    text = f"{value:.3f}" if isinstance(value, float) else str(value)
    text = text.replace("|", "\\|").replace("\n", "<br>")  # one table row per sample
    return text if len(text) <= 2000 else text[:2000] + "..."


def samples_markdown(rows: list[dict[str, Any]]) -> str:
    """A Markdown table of sample completions, as TensorBoard's text plugin renders it."""
    head = "| " + " | ".join(SAMPLE_COLUMNS) + " |\n|" + "---|" * len(SAMPLE_COLUMNS) + "\n"
    return head + "".join(
        "| " + " | ".join(_cell(r.get(c, "")) for c in SAMPLE_COLUMNS) + " |\n" for r in rows
    )


class NullLogger:
    """What ranks other than 0 log: nothing."""

    def __enter__(self) -> NullLogger:
        return self

    def __exit__(self, *exc) -> None:
        pass

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        pass

    def samples(self, step: int, rows: list[dict[str, Any]]) -> None:
        pass

    def message(self, text: str) -> None:
        pass


def _quiet_tensorboard_thread() -> None:
    """TensorBoard's writer thread re-raises a failed write (a full disk) after storing it for
    the next write in the trainer's thread, where `RunLogger` reports it in one line: the
    thread's own traceback is not printed."""
    previous = threading.excepthook
    if getattr(previous, "_rlvr", False):
        return

    def hook(args) -> None:
        if type(args.thread).__name__ != "_AsyncWriterThread":
            previous(args)

    hook._rlvr = True
    threading.excepthook = hook
