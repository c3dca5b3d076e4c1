"""Callbacks of the Python API: plain functions `fn(step, metrics)` after every step (returning
"stop" ends the run), and `transformers.TrainerCallback` objects, as TRL's trainer calls them.

A TrainerCallback receives `(args, state, control, **kwargs)` at the events that exist here:
on_train_begin, on_step_end (after each rollout step's update), on_log (every
`logging_steps` steps, `logs` = the step's metrics), on_evaluate (`metrics` = the held-out
numbers as `eval_<name>`), on_save (after a checkpoint) and on_train_end. `state` is a
`transformers.TrainerState` (`global_step` = the rollout step, `max_steps`, `log_history`),
`control` a `TrainerControl` whose `should_training_stop` ends the run after the step, as
"stop" does; kwargs hold `model`, `processing_class`, `optimizer` and `lr_scheduler`. `args`
is the `trl.GRPOConfig` passed as `args=`, else a `TrainingArguments` with the run's
output_dir, max_steps, seed, learning_rate, logging_steps and save_steps. A callback that
raises ends the run with a `CallbackError` naming the callback, the event and the error.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any

EVENTS = ("on_train_begin", "on_step_end", "on_log", "on_evaluate", "on_save", "on_train_end")


class CallbackError(RuntimeError):
    """A callback raised: which one, at which event and step, and its error."""


def is_trainer_callback(cb: Any) -> bool:
    """A TrainerCallback (or its class): an object with at least one of the event methods."""
    return not inspect.isfunction(cb) and any(hasattr(cb, e) for e in EVENTS)


def check_callbacks(callbacks: Sequence[Any]) -> None:
    from rlvr.config.schema import ConfigError

    for cb in callbacks:
        if not (is_trainer_callback(cb) or callable(cb)):
            raise ConfigError(
                f"callbacks: {cb!r} is neither fn(step, metrics) nor a transformers.TrainerCallback"
            )


def _name(cb: Any) -> str:
    if inspect.isfunction(cb) or inspect.ismethod(cb):
        return cb.__qualname__
    return type(cb).__name__


class Callbacks:
    """The run's callbacks; `step_end` and `evaluate` return True when one asks to stop."""

    def __init__(self, callbacks: Sequence[Any], *, args: Any, max_steps: int,
                 logging_steps: int = 1, objects: dict[str, Any] | None = None):  # fmt: skip
        items = [cb() if isinstance(cb, type) else cb for cb in callbacks]
        self.functions = [cb for cb in items if not is_trainer_callback(cb)]
        self.objects = [cb for cb in items if is_trainer_callback(cb)]
        self.logging_steps, self.kwargs = logging_steps, dict(objects or {})
        self.state = self.control = None
        if self.objects:
            from transformers import TrainerControl, TrainerState

            self.state = TrainerState(max_steps=max_steps, logging_steps=logging_steps)
            self.control = TrainerControl()
        self.args = args if args is not None and not isinstance(args, dict) else None

    def set_training_args(self, cfg) -> None:
        """TrainingArguments from the run's config, for callbacks without a GRPOConfig."""
        if not self.objects or self.args is not None:
            return
        from transformers import TrainingArguments

        t = cfg.train
        self.args = TrainingArguments(
            output_dir=t.output_dir, max_steps=t.max_steps, seed=t.seed,
            learning_rate=cfg.optim.lr, logging_steps=max(self.logging_steps, 1),
            save_steps=t.save_every or t.max_steps, report_to="none",
        )  # fmt: skip

    def _fire(self, event: str, step: int, **kwargs) -> bool:
        if not self.objects:
            return False
        self.state.global_step = step
        for cb in self.objects:
            method = getattr(cb, event, None)
            if method is None:
                continue
            try:
                method(self.args, self.state, self.control, **self.kwargs, **kwargs)
            except Exception as e:
                raise CallbackError(
                    f"callback {_name(cb)}.{event} failed at step {step}: {type(e).__name__}: {e}"
                ) from None
        return bool(self.control.should_training_stop)

    def train_begin(self, step: int) -> None:
        self._fire("on_train_begin", step)

    def step_end(self, step: int, metrics: dict[str, float]) -> bool:
        stop = False
        for fn in self.functions:
            try:
                stop = fn(step, metrics) == "stop" or stop
            except Exception as e:
                raise CallbackError(
                    f"callback {_name(fn)} failed at step {step}: {type(e).__name__}: {e}"
                ) from None
        stop = self._fire("on_step_end", step) or stop
        if self.objects and self.logging_steps and step % self.logging_steps == 0:
            logs = {k: v for k, v in metrics.items() if isinstance(v, (int, float))}
            self.state.log_history.append({**logs, "step": step})
            stop = self._fire("on_log", step, logs=logs) or stop
        return stop

    def evaluate(self, step: int, metrics: dict[str, float]) -> bool:
        return self._fire("on_evaluate", step, metrics={f"eval_{k}": v for k, v in metrics.items()})

    def save(self, step: int) -> None:
        self._fire("on_save", step)

    def train_end(self, step: int) -> None:
        self._fire("on_train_end", step)
