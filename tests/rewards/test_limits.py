"""reward.timeout_s: a reward call past the limit is a named failure of that reward, in the
trainer's process (abandoned) or in a worker process (killed); on_error decides the rest."""

from __future__ import annotations

import inspect
import os
import threading
import time

import pytest
import torch

from rlvr.config.load import load_config
from rlvr.config.schema import ConfigError
from rlvr.data.prompts import Prompt
from rlvr.rewards import RewardError, combine_rewards
from rlvr.rewards.limits import ProcessReward, RewardTimeout, with_time_limit
from rlvr.rewards.scoring import Scorer
from rlvr.rollout import Rollout

USER = """
import os, time
def hang(completions, **kwargs):
    time.sleep(600)
def length(completions, scale=1.0, **kwargs):
    return [scale * len(c) for c in completions]
def pid(completions, **kwargs):
    return [float(os.getpid())] * len(completions)
def exits(completions, **kwargs):
    raise SystemExit(3)
"""


@pytest.fixture()
def user(tmp_path):
    path = tmp_path / "user_rewards.py"
    path.write_text(USER)
    return str(path)


def test_in_process_call_past_the_limit_raises_a_named_timeout():
    release = threading.Event()

    def slow(completions, answer=None):
        release.wait(30)
        return [1.0] * len(completions)

    limited = with_time_limit(slow, "slow", 0.2)
    assert inspect.signature(limited) == inspect.signature(slow)  # same arguments bound
    t0 = time.monotonic()
    with pytest.raises(RewardTimeout, match=r"reward 'slow' .*reward.timeout_s=0.2 s"):
        limited(completions=["a"])
    assert time.monotonic() - t0 < 1.0
    t0 = time.monotonic()  # while the abandoned call runs, a new call fails at once
    with pytest.raises(RewardTimeout, match="previous call is still running"):
        limited(completions=["a"])
    assert time.monotonic() - t0 < 0.1
    release.set()
    time.sleep(0.1)
    assert limited(completions=["a", "b"]) == [1.0, 1.0]  # and works again once it returned


def test_the_call_runs_with_the_callers_grad_mode():
    def grad(completions):
        return [float(torch.is_grad_enabled())] * len(completions)

    limited = with_time_limit(grad, "grad", 5)
    with torch.no_grad():
        assert limited(completions=["a"]) == [0.0]
    assert limited(completions=["a"]) == [1.0]


def test_errors_and_values_pass_through_the_limit():
    def bad(completions):
        raise ValueError("bad input")

    with pytest.raises(ValueError, match="bad input"):
        with_time_limit(bad, "bad", 5)(completions=["x"])
    assert with_time_limit(len, "n", 0) is len  # 0: no limit, no wrapper


@pytest.mark.parametrize("on_error", ["zero", "raise"])
def test_a_timeout_is_a_failure_of_that_reward(on_error):
    release = threading.Event()

    def hangs(completions, **kwargs):
        release.wait(30)
        return [0.0] * len(completions)

    specs = [("ok", 1.0, lambda completions, **kw: [1.0] * len(completions)),
             ("hangs", 1.0, with_time_limit(hangs, "hangs", 0.3))]  # fmt: skip
    t0 = time.monotonic()
    try:
        if on_error == "raise":
            with pytest.raises(RewardError, match=r"reward\.timeout_s"):
                combine_rewards(specs, {"completions": ["a", "b", "c"]}, on_error=on_error)
        else:
            res = combine_rewards(specs, {"completions": ["a", "b", "c"]}, on_error=on_error)
            assert res.failures == {"ok": 0, "hangs": 3} and res.total == [1.0, 1.0, 1.0]
        # the per-sample retries of a timed-out reward fail fast: one limit, not one per sample
        assert time.monotonic() - t0 < 2.0
    finally:
        release.set()


def test_worker_process_is_killed_at_the_limit_and_replaced(user):
    hang = ProcessReward(f"{user}:hang", {}, "hang", 1.0)
    with pytest.raises(RewardTimeout, match="worker process killed"):
        hang(completions=["a"])
    assert hang.proc is None
    pid = ProcessReward(f"{user}:pid", {}, "pid", 30.0)
    first = pid(completions=["a"])[0]
    assert first != os.getpid() and pid(completions=["a"])[0] == first  # one warm worker
    os.kill(int(first), 9)
    time.sleep(0.2)
    assert pid(completions=["a"])[0] != first  # a dead worker is replaced
    pid.kill()


def test_worker_process_gives_the_same_scores_and_errors(user):
    length = ProcessReward(f"{user}:length", {"scale": 2.0}, "length", 30.0)
    assert "scale" not in inspect.signature(length).parameters
    assert length(completions=["ab", "abc"]) == [4.0, 6.0]
    exits = ProcessReward(f"{user}:exits", {}, "exits", 30.0)
    res = combine_rewards([("exits", 1.0, exits)], {"completions": ["a"]}, on_error="zero")
    assert res.failures == {"exits": 1}
    length.kill()
    exits.kill()


def _scorer(**reward):
    cfg = load_config(None, {"reward": reward, "algo": {"soft_overlong": False}})
    return Scorer.build(cfg, task=None)


def test_the_scorer_applies_reward_timeout_s(user):
    scorer = _scorer(accuracy="math", extra=[f"{user}:hang=1"], timeout_s=0.3, on_error="zero")
    prompts = [Prompt(text="q", ids=[5], answer="1", example=None)] * 2
    rollout = Rollout(prompt_ids=[[5]] * 2, completion_ids=torch.zeros(2, 3, dtype=torch.long),
                      lengths=torch.tensor([2, 3]), truncated=torch.zeros(2, dtype=torch.bool),
                      group_size=2)  # fmt: skip
    t0 = time.monotonic()
    scores = scorer(prompts, ["\\boxed{1}", "2"], rollout)
    assert scores.failures["hang"] == 2 and time.monotonic() - t0 < 10
    assert "timeout_s" in scores.errors["hang"]
    isolated = _scorer(accuracy="math", extra=[f"{user}:length=1"], isolate_user=True)
    assert isinstance(isolated.shaping[0][2], ProcessReward)
    isolated.shaping[0][2].kill()


@pytest.mark.parametrize(
    ("reward", "message"),
    [({"timeout_s": -1.0}, "reward.timeout_s"), ({"timeout_s": float("inf")}, "reward.timeout_s"),
     ({"accuracy": "code", "params": {"code": {"isolation": "none"}}}, "reward.sandbox_isolation"),
     ({"sandbox_isolation": "off"}, "sandbox_isolation")],
)  # fmt: skip
def test_bad_limit_and_isolation_settings_are_refused_by_name(reward, message):
    with pytest.raises(ConfigError, match=message):
        _scorer(**{"accuracy": "math", **reward})
