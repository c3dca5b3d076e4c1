"""A wall-clock limit on each call of a reward function (`reward.timeout_s`).

Two ways to run a reward under the limit:

  - in-process (the default, `with_time_limit`): the call runs in a thread of the trainer and
    the trainer waits at most `timeout_s` for it. Rewards then share the trainer's memory
    (a reward model already on the GPU, a closure, a cache), and a call costs no copying of
    the batch; a thread cannot be killed, though, so a call past the limit is abandoned: it
    raises `RewardTimeout` (a failure of that reward, which `reward.on_error` turns into a
    stopped step or zeros), and until the abandoned call returns, further calls of the same
    reward fail at once instead of piling up more threads;
  - in a worker process (`reward.isolate_user: true`, for user functions named
    "module:function" or "path/file.py:function": `ProcessReward`): the function is imported
    and called in a child process that is killed at the limit and replaced on the next call.
    Costs one process start (importing the user's module) and pickling the batch each call.
    The worker dies with the trainer even if it is stuck in C (`_lifeline`).

Either way a hanging reward ends the step within `timeout_s`, so SIGTERM (which lets the
step finish, then saves) ends the run within that time; a second SIGTERM exits at once. A
worker process that is stopped (SIGSTOP, Ctrl-Z) for 2 s to 3 s while a call waits on it is
killed and the call fails naming it (`rlvr.rewards.sandbox.liveness`), with or without a time
limit.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import os
import pickle
import struct
import subprocess
import sys
import threading
from collections.abc import Callable
from typing import Any

from rlvr.rewards.sandbox.liveness import Helper, ProcessLost, wait_until


class RewardTimeout(RuntimeError):
    """A reward call ran past `reward.timeout_s`."""

    def __init__(self, name: str, timeout_s: float, why: str = "") -> None:
        super().__init__(
            f"reward {name!r} did not return within reward.timeout_s={timeout_s:g} s{why}"
        )
        self.name, self.timeout_s = name, timeout_s


def awaited(value: Any) -> Any:
    """`value`, or what it resolves to when it is awaitable (an `async def` reward's
    coroutine, as TRL awaits them): run to completion on an event loop of its own, in a
    thread of its own when this thread already runs a loop (a notebook cell)."""
    if not inspect.isawaitable(value):
        return value

    async def wait() -> Any:
        return await value

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(wait())
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = asyncio.run(wait())
        except BaseException as e:  # re-raised in the caller's thread
            box["error"] = e

    thread = threading.Thread(target=run, name="reward event loop", daemon=True)
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]
    return box["value"]


def with_time_limit(fn: Callable, name: str, timeout_s: float) -> Callable:
    """`fn` with each call limited to `timeout_s` seconds of wall clock (0: no limit). Keeps
    `fn`'s signature, so the keyword arguments it is given are the same."""
    if not timeout_s:
        return fn
    busy: list[threading.Thread] = []  # the abandoned call, while it still runs

    @functools.wraps(fn)
    def limited(*args, **kwargs):
        if busy and busy[0].is_alive():
            raise RewardTimeout(name, timeout_s, "; its previous call is still running")
        busy.clear()
        box: dict[str, Any] = {}
        enter_callers_state = _thread_state()

        def run() -> None:
            try:
                with enter_callers_state():
                    box["value"] = awaited(fn(*args, **kwargs))
            except BaseException as e:  # re-raised in the caller's thread
                box["error"] = e

        thread = threading.Thread(target=run, name=f"reward {name}", daemon=True)
        thread.start()
        thread.join(timeout_s)
        if thread.is_alive():
            busy.append(thread)
            raise RewardTimeout(name, timeout_s)
        if "error" in box:
            raise box["error"]
        return box["value"]

    return limited


def _thread_state() -> Callable:
    """A context manager that gives another thread the caller's per-thread torch state (grad
    mode, current CUDA device), so a reward behaves as it would in the caller's thread."""
    torch = sys.modules.get("torch")
    if torch is None:
        return contextlib.nullcontext
    grad = torch.is_grad_enabled()
    device = torch.cuda.current_device() if torch.cuda.is_initialized() else None

    @contextlib.contextmanager
    def enter():
        if device is not None:
            torch.cuda.set_device(device)
        with torch.set_grad_enabled(grad):
            yield

    return enter


_HEADER = struct.Struct("<Q")


def _send(pipe, obj: Any) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    pipe.write(_HEADER.pack(len(data)) + data)
    pipe.flush()


def _recv(pipe) -> Any:
    header = pipe.read(_HEADER.size)
    if len(header) < _HEADER.size:
        raise EOFError("the reward worker exited")
    return pickle.loads(pipe.read(_HEADER.unpack(header)[0]))


class ProcessReward:
    """The user function `spec` with `params`, called in a worker process that is killed
    when a call runs past `timeout_s`. The function is also imported here once, to check the
    spec at build time and to give this object its signature."""

    def __init__(
        self,
        spec: str,
        params: dict[str, Any],
        name: str,
        timeout_s: float,
        python_path: tuple[str, ...] = (),
    ) -> None:
        from rlvr.rewards.user import load_user_reward

        self.spec, self.params, self.name, self.timeout_s = spec, dict(params), name, timeout_s
        self.python_path = tuple(python_path)  # the worker's sys.path entries (PYTHONPATH)
        fn = load_user_reward(spec)
        sig = inspect.signature(fn)
        self.__signature__ = sig.replace(
            parameters=[p for p in sig.parameters.values() if p.name not in self.params]
        )
        self.proc: subprocess.Popen | None = None
        self._lock = threading.Lock()

    def _start(self) -> subprocess.Popen:
        code = "from rlvr.rewards.limits import serve; serve()"
        env = dict(os.environ)
        if self.python_path:
            env["PYTHONPATH"] = os.pathsep.join([*self.python_path, env.get("PYTHONPATH", "")])
        proc = subprocess.Popen(
            [sys.executable, "-c", code, str(os.getpid())],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            start_new_session=True,  # Ctrl-C in a terminal goes to the trainer only
            env=env,
        )
        _send(proc.stdin, (self.spec, self.params))
        return proc

    def kill(self) -> None:
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()
            self.proc.wait()
            self.proc = None

    def __call__(self, **kwargs):
        with self._lock:
            if self.proc is None or self.proc.poll() is not None:
                self.kill()
                self.proc = self._start()
            proc, result = self.proc, []

            def exchange() -> None:
                with contextlib.suppress(OSError, EOFError, ValueError):  # the worker died
                    _send(proc.stdin, kwargs)
                    result.append(_recv(proc.stdout))

            thread = threading.Thread(target=exchange, daemon=True)
            thread.start()
            helper = Helper(f"the worker process of reward {self.name!r}", proc.pid, proc)
            try:
                wait_until(
                    lambda s: not (thread.join(s) or thread.is_alive()),
                    helper, "scoring a batch", self.timeout_s or None,
                )  # fmt: skip
            except ProcessLost:
                self.kill()  # unblocks the exchange
                thread.join()
                raise
            if thread.is_alive() or not result:
                alive = thread.is_alive()
                self.kill()  # unblocks the exchange
                thread.join()
                if alive:
                    raise RewardTimeout(self.name, self.timeout_s, " (worker process killed)")
                raise RuntimeError(f"reward {self.name!r}: the worker process died")
            ok, value = result[0]
            if not ok:
                raise value
            return value

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.kill()


def serve() -> None:
    """The worker: load the function, then answer calls until stdin closes."""
    from rlvr.rewards._lifeline import die_with

    die_with(int(sys.argv[1]))
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # the function's prints must not corrupt the replies
    from rlvr.rewards.user import load_user_reward

    spec, params = _recv(stdin)
    fn = functools.partial(load_user_reward(spec), **params)
    while True:
        try:
            kwargs = _recv(stdin)
        except EOFError:
            return
        try:
            reply = (True, awaited(fn(**kwargs)))
        except BaseException as e:  # sent back: a failing reward, under reward.on_error
            reply = (False, e if _picklable(e) else RuntimeError(f"{type(e).__name__}: {e}"))
        _send(stdout, reply)


def _picklable(obj: Any) -> bool:
    try:
        pickle.dumps(obj)
        return True
    except Exception:
        return False
