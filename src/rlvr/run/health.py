"""Training health: stop on a run of non-finite updates, warn on entropy collapse and
degenerate outputs, and say when a step trained on nothing (and why) or when rewards failed.
Warnings go into the step's metrics (`warn/*`) and, when a condition starts, onto the screen
once (not every step while it lasts).

A solved task is not a collapse: as accuracy nears 100% the policy rightly becomes
deterministic (entropy falls, the G responses of a group coincide). At or above
`SOLVED_ACCURACY` those two conditions are reported as `info/solved`, not as warnings.
"""

from __future__ import annotations

from pathlib import Path

# Step accuracy from which low entropy and identical groups mean "solved", not "collapsed":
# the default run's steps past 0.9 held-out accuracy all sit at 0.95-1.0 step accuracy with
# entropy falling below 0.01, and their held-out accuracy keeps rising.
SOLVED_ACCURACY = 0.9


class TrainingHealthError(RuntimeError):
    """The run cannot continue; the message names the step and the last good checkpoint."""


def _solved(m: dict) -> bool:
    return m.get("accuracy", 0.0) >= SOLVED_ACCURACY


# metric -> (test on the step's metrics, what to tell the user)
WARNINGS = {
    "warn/entropy_collapse": (
        lambda m, floor: m.get("entropy", float("inf")) < floor and not _solved(m),
        "mean token entropy {entropy:.4f} fell below train.entropy_floor at accuracy "
        "{accuracy:.2f}: the policy is collapsing (exploration is gone; consider "
        "algo.clip_high, a lower lr, or kl_coef)",
    ),
    "warn/repeated_token": (
        lambda m, _: m.get("response/repeat_frac", 0.0) > 0.5,
        "{response/repeat_frac:.0%} of responses are one token repeated: outputs degenerate",
    ),
    "warn/identical_groups": (
        lambda m, _: m.get("groups/identical_frac", 0.0) > 0.9 and not _solved(m),
        "{groups/identical_frac:.0%} of groups have G identical responses: no exploration left",
    ),
}

# Why a step trained on nothing: `update/skipped` is 1 and `update/skip_reason` says which.
SKIP_REASONS = {
    "all_solved": "every group was solved (all G responses correct: no advantage to learn from)",
    "all_failed": "every group failed (no response correct: no advantage to learn from)",
    "all_filtered": "dynamic sampling filtered every group ({groups/all_correct_frac:.0%} of "
    "responses in all-correct groups, {groups/all_wrong_frac:.0%} in all-wrong ones)",
    "all_truncated": "every kept response was truncated and algo.overlong_filter masked it",
    "all_equal": "every group's G rewards were equal (no advantage to learn from)",
}

# Steps in a row with nothing to train on after which the run says, once, what to change.
ADVICE_AFTER = 3
ADVICE = {
    "all_failed": "no response counted as correct (an accuracy score above "
    "reward.correct_threshold): a reward never above it, such as a continuous or negative "
    "one, cannot drive dynamic sampling's accuracy filter; name the reward that says correct "
    "with reward.accuracy=NAME, set reward.accuracy=none (keep the groups whose rewards "
    "differ), lower reward.correct_threshold, or set algo.dynamic_sampling=false",
    "all_solved": "every response was correct: the prompts are too easy for the model; "
    "train on harder data or raise reward.correct_threshold",
    "all_equal": "the reward gave every response of a group the same value: check that it "
    "tells responses apart, or raise rollout.temperature for more varied responses",
    "all_filtered": "dynamic sampling kept no group in algo.max_gen_batches generation "
    "batches; raise algo.max_gen_batches or set algo.dynamic_sampling=false",
    "all_truncated": "every response hit rollout.max_new_tokens; raise it or set "
    "algo.overlong_filter=false",
}


def skip_reason(m: dict) -> str | None:
    """Which SKIP_REASONS key applies to a step's metrics, or None when it trained."""
    if m.get("groups/kept", 1) == 0 or m.get("empty_batches", 0):
        if m.get("groups/equal_reward_frac", 0.0) >= 1.0:
            return "all_equal"
        if m.get("groups/all_correct_frac", 0.0) >= 1.0:
            return "all_solved"
        if m.get("groups/all_wrong_frac", 0.0) >= 1.0:
            return "all_failed"
        return "all_filtered"
    if m.get("loss_tokens", 1.0) == 0:
        return "all_truncated"
    return None


class HealthGuard:
    def __init__(self, *, max_bad_steps: int, entropy_floor: float):
        self.max_bad_steps, self.entropy_floor = max_bad_steps, entropy_floor
        self.bad_streak = 0
        self._active: set[str] = set()
        self.skip_streak, self._advised = 0, False

    def check(self, step: int, metrics: dict, last_checkpoint: Path | None) -> list[str]:
        """Add `warn/*`, `info/solved` and `update/*` to `metrics`; return messages for
        conditions that just began (a reward's failures included).
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
        messages = self._skipped(step, metrics) + self._failures(step, metrics)
        for key, (test, text) in WARNINGS.items():
            on = bool(test(metrics, self.entropy_floor))
            metrics[key] = float(on)
            if on and key not in self._active:
                messages.append(f"warning at step {step}: " + text.format_map(_Fmt(metrics)))
            (self._active.add if on else self._active.discard)(key)
        solved = _solved(metrics) and (
            metrics.get("entropy", float("inf")) < self.entropy_floor
            or metrics.get("groups/identical_frac", 0.0) > 0.9
        )
        metrics["info/solved"] = float(solved)
        if solved and "info/solved" not in self._active:
            messages.append(
                f"step {step}: accuracy {metrics['accuracy']:.2f} with low entropy or identical "
                "groups: the task is (nearly) solved, which is not a collapse"
            )
        (self._active.add if solved else self._active.discard)("info/solved")
        return messages

    def _skipped(self, step: int, metrics: dict) -> list[str]:
        reason = skip_reason(metrics)
        metrics["update/skipped"] = float(reason is not None)
        self.skip_streak = 0 if reason is None else self.skip_streak + 1
        if reason is None:
            self._active = {k for k in self._active if not k.startswith("skip:")}
            return []
        metrics["update/skip_reason"] = reason
        out = []
        if self.skip_streak == ADVICE_AFTER and not self._advised:  # once a run
            self._advised = True
            out.append(
                f"step {step}: no update in {ADVICE_AFTER} steps in a row ({reason}): "
                + ADVICE[reason]
            )
        key = f"skip:{reason}"
        if key in self._active:
            return out
        self._active = {k for k in self._active if not k.startswith("skip:")} | {key}
        text = SKIP_REASONS[reason].format_map(_Fmt(metrics))
        return [f"step {step}: no update, nothing to train on: {text}", *out]

    def _failures(self, step: int, metrics: dict) -> list[str]:
        n = int(metrics.get("responses", 0))
        out = []
        for key, count in metrics.items():
            if not key.startswith("failures/"):
                continue
            if not count:
                self._active.discard(key)
            elif key not in self._active:
                self._active.add(key)
                name = key.split("/", 1)[1]
                of = f" of {n}" if n else ""
                out.append(
                    f"step {step}: reward {name!r} failed on {int(count)}{of} responses, "
                    "scored 0 (reward.on_error=zero)"
                )
        return out


class _Fmt(dict):
    """format_map over metrics where a missing number reads as nan, not a KeyError."""

    def __missing__(self, key: str) -> float:
        return float("nan")
