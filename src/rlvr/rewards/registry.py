"""The reward registry: `REWARDS` (default-configured functions) and `make_reward`."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable

from rlvr.config.names import did_you_mean
from rlvr.rewards.code_reward import make_code_reward
from rlvr.rewards.format import make_format_reward
from rlvr.rewards.language import make_language_reward
from rlvr.rewards.length import make_soft_overlong_reward
from rlvr.rewards.math import make_math_reward
from rlvr.rewards.model_based import make_judge_reward, make_reward_model_reward
from rlvr.rewards.user import load_user_reward

FACTORIES: dict[str, Callable] = {
    "math": make_math_reward,
    "format": make_format_reward,
    "language": make_language_reward,
    "soft_overlong": make_soft_overlong_reward,
    "code": make_code_reward,
    "reward_model": make_reward_model_reward,
    "judge": make_judge_reward,
}
_NEEDS_PARAMS = {"reward_model", "judge"}


def _needs_model(name: str) -> Callable:
    def fn(completions, **kwargs):
        raise ValueError(f"reward {name!r} needs a model: make_reward({name!r}, model=...)")

    fn.__name__ = name
    return fn


REWARDS: dict[str, Callable] = {
    name: (_needs_model(name) if name in _NEEDS_PARAMS else factory())
    for name, factory in FACTORIES.items()
}


def make_reward(name: str, **params) -> Callable:
    """A reward function configured with `params`.

    `name` is a key of REWARDS, or "module:function" / "path/file.py:function" for a user
    function (its params are bound as keyword arguments). Unknown names and unknown params
    raise ValueError listing the valid ones.
    """
    if ":" in name:
        fn = load_user_reward(name)
        return functools.partial(fn, **params) if params else fn
    if name not in FACTORIES:
        raise ValueError(
            f"unknown reward {name!r}{did_you_mean(name, FACTORIES)}; valid: {sorted(FACTORIES)} or 'module:function' (a "
            "function defined in a script and passed to rlvr.train is recorded by its name: "
            "pass it again through rlvr.train, or name another reward here)"
        )
    factory = FACTORIES[name]
    valid = [p for p in inspect.signature(factory).parameters if p != "kwargs"]
    for key in params:
        if key not in valid:
            raise ValueError(
                f"reward {name!r} has no parameter {key!r}{did_you_mean(key, valid)}; valid: {valid}"
            )
    return factory(**params)
