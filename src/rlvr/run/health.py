"""Training health: stop on a run of non-finite updates, warn on entropy collapse and
degenerate outputs. Warnings go into the step's metrics (`warn/*`) and, when a condition
starts, onto the screen once (not every step while it lasts)."""

from __future__ import annotations

from pathlib import Path


class TrainingHealthError(RuntimeError):
    """The run cannot continue; the message names the step and the last good checkpoint."""


# metric -> (test on the step's metrics, what to tell the user)
WARNINGS = {
    "warn/entropy_collapse": (
        lambda m, floor: m.get("entropy", float("inf")) < floor,
        "mean token entropy {entropy:.4f} fell below train.entropy_floor: the policy is "
        "collapsing (exploration is gone; consider algo.clip_high, a lower lr, or kl_coef)",
    ),
    "warn/repeated_token": (
        lambda m, _: m.get("response/repeat_frac", 0.0) > 0.5,
        "{response/repeat_frac:.0%} of responses are one token repeated: outputs degenerate",
    ),
    "warn/identical_groups": (
        lambda m, _: m.get("groups/identical_frac", 0.0) > 0.9,
        "{groups/identical_frac:.0%} of groups have G identical responses: no exploration left",
    ),
}


class HealthGuard:
    def __init__(self, *, max_bad_steps: int, entropy_floor: float):
        self.max_bad_steps, self.entropy_floor = max_bad_steps, entropy_floor
        self.bad_streak = 0
        self._active: set[str] = set()

    def check(self, step: int, metrics: dict, last_checkpoint: Path | None) -> list[str]:
        """Add `warn/*` flags to `metrics`; return messages for conditions that just began.
        Raises TrainingHealthError after `max_bad_steps` non-finite steps in a row."""
        if metrics.get("nonfinite_updates", 0) > 0:
            self.bad_streak += 1
        else:
            self.bad_streak = 0
        metrics["bad_step_streak"] = self.bad_streak
        if self.bad_streak >= self.max_bad_steps:
            where = last_checkpoint or "none saved yet"
            raise TrainingHealthError(
                f"step {step}: {self.bad_streak} steps in a row had a NaN/inf loss or gradient "
                f"(their updates were skipped); last good checkpoint: {where}"
            )
        messages = []
        for key, (test, text) in WARNINGS.items():
            on = bool(test(metrics, self.entropy_floor))
            metrics[key] = float(on)
            if on and key not in self._active:
                messages.append(f"warning at step {step}: " + text.format_map(metrics))
            (self._active.add if on else self._active.discard)(key)
        return messages
