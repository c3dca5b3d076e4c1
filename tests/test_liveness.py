"""A helper process stopped (SIGSTOP) or gone while the trainer waits on it ends the wait with
one error naming it, within seconds, instead of a wait with no end
(rlvr.rewards.sandbox.liveness); a helper that runs, however slowly, is waited for.

Each test stops a real child: the sandbox's zygote, an isolated reward's worker and the
math-verify worker (the vLLM servers' waits are bounded by their heartbeats instead:
tests/test_vllm_server.py). A call that could hang runs on
a thread (or in a subprocess) with a deadline, and every child is continued and killed in a
`finally`.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from rlvr.rewards.sandbox import liveness
from rlvr.rewards.sandbox.liveness import Helper, ProcessLost, during, state, wait_until

BOUND_S = 15.0  # a stopped helper is named after 3 looks 1 s apart; the rest is a loaded CPU


def _begin(fn: Callable[[], Any]) -> tuple[threading.Thread, dict[str, Any]]:
    """`fn()` started on a thread; its box gets what it raises."""
    box: dict[str, Any] = {"t0": time.monotonic()}

    def run() -> None:
        try:
            fn()
        except BaseException as e:
            box["error"] = e

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, box


def _end(begun: tuple[threading.Thread, dict[str, Any]], seconds: float):
    """What the call raised (None if it returned) and how long it took since it began; fails
    the test (instead of hanging it) when it has not ended within `seconds` from now."""
    thread, box = begun
    thread.join(seconds)
    assert not thread.is_alive(), f"still waiting after {seconds:g} s: the wait hangs"
    return box.get("error"), time.monotonic() - box["t0"]


def _within(seconds: float, fn: Callable[[], Any]) -> tuple[BaseException | None, float]:
    return _end(_begin(fn), seconds)


def _release(*pids: int) -> None:
    """Continue and kill whatever of `pids` still runs (the tests' cleanup)."""
    for pid in pids:
        for sig in (signal.SIGCONT, signal.SIGKILL):
            try:
                os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                break


def _stop(pid: int) -> None:
    os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + 5
    while state(pid) != "stopped" and time.monotonic() < deadline:
        time.sleep(0.01)


@pytest.fixture()
def sleeper():
    proc = subprocess.Popen(["sleep", "60"])
    try:
        yield proc
    finally:
        _release(proc.pid)
        proc.wait()


def _never(seconds: float) -> bool:
    time.sleep(seconds)
    return False


# ---- the helper ------------------------------------------------------------------------------


def test_state_reads_running_stopped_zombie_and_gone(sleeper):
    assert state(sleeper.pid) == "running"  # sleeping counts as running
    _stop(sleeper.pid)
    assert state(sleeper.pid) == "stopped"
    os.kill(sleeper.pid, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while state(sleeper.pid) != "zombie" and time.monotonic() < deadline:
        time.sleep(0.01)
    assert state(sleeper.pid) == "zombie"  # dead, not yet reaped
    sleeper.wait()
    assert state(sleeper.pid) == "gone"


def test_a_stopped_helper_is_named_with_what_it_was_doing(sleeper):
    _stop(sleeper.pid)
    helper = Helper("the sleeper", sleeper.pid, sleeper, advice="start it again")

    def wait():
        with during("step 3's batch"):
            wait_until(_never, helper, "sleeping")

    error, took = _within(BOUND_S, wait)
    assert isinstance(error, ProcessLost), error
    assert str(error) == (
        f"the sleeper (pid {sleeper.pid}) is stopped (SIGSTOP or Ctrl-Z: seen stopped at 3 looks "
        "1 s apart) while sleeping, for step 3's batch; start it again"
    )
    # three looks a poll apart: not at the first look, and not much after the third
    assert liveness.POLL_S * 2 <= took < liveness.POLL_S * liveness.STOPPED_LOOKS + 5


def test_a_helper_stopped_for_less_than_the_looks_is_waited_for(sleeper):
    """Stopped for 1.5 s (one look sees it), then continued: the wait goes on to its answer."""
    _stop(sleeper.pid)
    threading.Timer(1.5, os.kill, (sleeper.pid, signal.SIGCONT)).start()
    answer_at = time.monotonic() + 3.5

    def answered(seconds: float) -> bool:
        return _never(min(seconds, max(0.0, answer_at - time.monotonic()))) or (
            time.monotonic() >= answer_at
        )

    helper = Helper("the sleeper", sleeper.pid, sleeper)
    error, _ = _within(BOUND_S, lambda: wait_until(answered, helper, "sleeping"))
    assert error is None


def test_a_slow_helper_is_waited_for_and_a_limit_only_where_one_is_given(sleeper):
    helper = Helper("the sleeper", sleeper.pid, sleeper)
    answer_at = time.monotonic() + 3.5  # past three looks: running, so no error
    assert wait_until(lambda s: _never(min(s, 0.1)) or time.monotonic() >= answer_at, helper, "x")
    t0 = time.monotonic()
    assert wait_until(_never, helper, "x", timeout_s=0.3) is False
    assert time.monotonic() - t0 < 1.0


def test_a_helper_that_exits_holding_its_pipe_open_is_named():
    """The helper's child keeps the pipe open, so no EOF ever comes: its exit is seen by looking."""
    proc = subprocess.Popen(["sh", "-c", "sleep 60 & exit 3"], stdout=subprocess.PIPE,
                            start_new_session=True)  # fmt: skip
    try:
        fd = proc.stdout.fileno()
        import select

        error, took = _within(BOUND_S, lambda: wait_until(
            lambda s: bool(select.select([fd], [], [], s)[0]),
            Helper("the shell", proc.pid, proc), "reading"))  # fmt: skip
        assert str(error) == f"the shell (pid {proc.pid}) exited with code 3 while reading"
        assert took < 5
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        proc.stdout.close()


def _stopped_at_birth(module, monkeypatch) -> list[subprocess.Popen]:
    """Every process `module` starts with subprocess.Popen is stopped (SIGSTOP) as soon as it
    exists; the list it returns collects them for the test to release."""
    started: list[subprocess.Popen] = []
    popen = subprocess.Popen

    def stopped(*args, **kwargs):
        proc = popen(*args, **kwargs)
        os.kill(proc.pid, signal.SIGSTOP)
        started.append(proc)
        return proc

    monkeypatch.setattr(module.subprocess, "Popen", stopped)
    return started


# ---- the sandbox's zygote, an isolated reward's worker, the math-verify worker ----------------


def test_a_stopped_zygote_is_named_and_replaced():
    from rlvr.rewards.sandbox import Limits, SandboxError, run_python, zygote

    fast = Limits(timeout_s=5)
    try:
        run_python("print(1)", limits=fast)
    except SandboxError as e:  # no namespaces here: no zygote
        pytest.skip(str(e))
    old = zygote.zygote().proc
    try:
        _stop(old.pid)
        error, took = _within(BOUND_S, lambda: run_python("print(2)", limits=fast))
        assert isinstance(error, SandboxError), error
        assert str(error).startswith(f"the sandbox's zygote (pid {old.pid}) is stopped (SIGSTOP")
        assert took < 10
        assert "while forking a sandbox's launcher" in str(error)
        assert old.poll() == -signal.SIGKILL
        assert run_python("print(3)", limits=fast).stdout == "3\n"  # a new zygote
    finally:
        _release(old.pid)


USER = """
import os, time
def slow(completions, **kwargs):
    time.sleep(3 if completions == ["slow"] else 0)
    return [float(os.getpid())] * len(completions)
"""


def test_a_stopped_reward_worker_without_a_limit_is_named_and_replaced(tmp_path):
    from rlvr.rewards.limits import ProcessReward

    (tmp_path / "user_rewards.py").write_text(USER)
    reward = ProcessReward(f"{tmp_path / 'user_rewards.py'}:slow", {}, "slow", 0.0)  # no limit
    try:
        first = reward(completions=["a"])[0]
        waiter = _begin(lambda: reward(completions=["slow"]))
        time.sleep(0.5)  # inside the 3 s call
        _stop(int(first))
        error, _ = _end(waiter, BOUND_S)
        assert isinstance(error, ProcessLost), error
        named = f"the worker process of reward 'slow' (pid {int(first)}) is stopped (SIGSTOP"
        assert str(error).startswith(named)
        assert state(int(first)) == "gone"  # killed and reaped
        assert reward(completions=["a"])[0] != first  # a new worker
    finally:
        if reward.proc is not None:
            _release(reward.proc.pid)
        reward.kill()


@pytest.fixture()
def fresh_verifier():
    """The module's math-verify worker replaced by one of this test's; killed after."""
    from rlvr.rewards import _verifier

    with _verifier._lock:
        if _verifier._worker is not None:
            _verifier._worker.kill()
        _verifier._worker = None
    yield _verifier
    with _verifier._lock:
        if _verifier._worker is not None:
            _release(_verifier._worker.proc.pid)
            _verifier._worker.kill()
        _verifier._worker = None


def test_a_verifier_stopped_while_it_starts_is_named(fresh_verifier, monkeypatch):
    started = _stopped_at_birth(fresh_verifier, monkeypatch)
    try:
        error, took = _within(BOUND_S, fresh_verifier.warm_up)
        assert isinstance(error, ProcessLost), error
        assert str(error).startswith(f"the math-verify worker (pid {started[0].pid}) is stopped")
        assert took < 10
        assert "while starting (importing math-verify)" in str(error)
        monkeypatch.undo()
        assert fresh_verifier.verify_in_worker("1/2", "0.5", timeout_s=30)  # a new one works
    finally:
        _release(*(p.pid for p in started))


def test_a_verifier_stopped_during_a_long_call_is_named(fresh_verifier):
    fresh_verifier.warm_up()
    pid = fresh_verifier._worker.proc.pid
    try:
        _stop(pid)
        call = lambda: fresh_verifier.verify_in_worker("1/2", "0.5", timeout_s=600)  # noqa: E731
        error, took = _within(BOUND_S, call)
        assert isinstance(error, ProcessLost), error
        assert str(error).startswith(f"the math-verify worker (pid {pid}) is stopped")
        assert took < 10
        assert "while checking an answer" in str(error)
        assert fresh_verifier.verify_in_worker("1/2", "0.5", timeout_s=30)
    finally:
        _release(pid)


def test_nothing_here_assumes_linux_for_gone(monkeypatch, sleeper):
    """Without /proc a helper is running until it is gone (signal 0)."""
    monkeypatch.setattr(liveness, "_PROC", False)
    assert state(sleeper.pid) == "running"
    _release(sleeper.pid)
    sleeper.wait()
    assert state(sleeper.pid) == "gone"
