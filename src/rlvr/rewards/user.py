"""User reward functions named "module:function" or "path/to/file.py:function"."""

from __future__ import annotations

from rlvr.config.callables import load_callable


def load_user_reward(spec: str):
    """The callable that `spec` names. It is called as every reward is
    (`rlvr.rewards.combine`): `fn(prompts, completions, completion_ids, **kwargs) ->
    list[float | None]` with keyword arguments only (the reference as `answer`, dataset
    columns under their own names, the trainer's `completion_lengths`, `truncated`, ...).

    Raises ValueError with the reason: no ":", file or module not found, import failed,
    attribute missing, or not callable.
    """
    return load_callable(spec, "user reward")
