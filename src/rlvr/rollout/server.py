"""The rollout server (docs/async.md): `rollout.engine` in a process of its own, so that a
batch ahead (train.max_staleness = k > 0) is generated while the trainer updates.

    trainer process                               server process (rlvr.rollout.server_main)
    ServerEngine.generate(prompts, params)  --->  its engine (fast or vllm) on its own model
    weights written into shared memory      --->  copied into that model, engine.sync_weights()

`ServerEngine` is a `RolloutEngine` like the others, so training, `rlvr eval` and tools work
through it unchanged (a task's tools run in the server, inside the response, as they would in
process). The two processes talk over one socket pair (pickled messages, this package's own
types only); the server exits when the trainer's end closes, and is killed with it
(PR_SET_PDEATHSIG) if the trainer is killed.

Weights. One shared-memory file holds every weight the policy computes with, under the base
model's names (`weight_sync.policy_weights`: LoRA merged into its targets, whole tensors).
After an optimiser step `sync_weights` only marks them changed; they are written, only the
ones training can change (`trainable_names`), before the next `generate` that is not
`pinned`. The pipeline pins the weights of version t-1 while it produces a batch ahead beside
step t's update: the update changes the trainer's weights, not the ones the server samples
with. The server receives them only between two of its requests.

A server that dies (a signal, an error) or stays stopped (SIGSTOP, Ctrl-Z) while the trainer
waits on it ends the run with `ServerError`, one line naming it, how it was found and what it
was doing (`rlvr.rewards.sandbox.liveness`: looked at every second, stopped at 3 looks in a
row is lost; no deadline on a server that runs, however slowly); the checkpoints are left as
they were, and `--resume` continues the run.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import socket
import subprocess
import sys
import tempfile
import threading
from dataclasses import replace
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from rlvr.config.placement import check_ranks, parse_cpus
from rlvr.rewards.sandbox.liveness import Helper, wait_until
from rlvr.rollout.base import EngineSite, Rollout, SamplingParams
from rlvr.rollout.weight_sync import is_peft, policy_weights, trainable_names

if TYPE_CHECKING:
    from rlvr.config.schema import Config

_LAUNCH_VARS = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
)
_ALIGN = 64  # bytes: each weight starts on a cache line of the shared file
# what the server does while the trainer waits for its answer to each request, for its errors
_DOING = {
    "start": "starting (building its model and engine)",
    "weights": "loading new weights",
    "generate": "generating",
    "release": "releasing its engine's memory",
}
_RESUME = "the checkpoints are as they were: continue with rlvr train --resume RUN_DIR"
# A request this small fits the socket's buffer (about 208 KiB, empty between requests) and is
# sent at once; a larger one (a batch's prompt ids) is sent on a thread while the trainer
# looks at the server, which may be stopped before reading it.
_DIRECT_BYTES = 1 << 16


class ServerError(RuntimeError):
    """The rollout server failed or exited; the message names how."""


def _server_device(cfg: Config, site: EngineSite) -> torch.device | None:
    """`rollout.server.device`, else the trainer's."""
    return torch.device(cfg.rollout.server.device) if cfg.rollout.server.device else site.device


def pin_trainer(cfg: Config) -> None:
    """The trainer's CPUs (`rollout.server.trainer_cpus`) and one torch thread per CPU."""
    text = cfg.rollout.server.trainer_cpus
    if cfg.rollout.server.enabled and text:
        cpus = parse_cpus("rollout.server.trainer_cpus", text)
        os.sched_setaffinity(0, cpus)
        torch.set_num_threads(len(cpus))


def _base(model: torch.nn.Module) -> torch.nn.Module:
    return model.get_base_model() if is_peft(model) else model


class SharedWeights:
    """The policy's weights in one shared-memory file, laid out by name: the trainer writes
    them, the server reads them (`views`)."""

    def __init__(self, layout: list[tuple[str, str, tuple[int, ...], int]], path: str, size: int):
        self.layout, self.path, self.size = layout, path, size
        buffer = torch.from_file(path, shared=True, size=max(size, 1), dtype=torch.uint8)
        self.views = {
            name: buffer[offset : offset + _nbytes(dtype, shape)]
            .view(getattr(torch, dtype))
            .view(shape)
            for name, dtype, shape, offset in layout
        }

    @classmethod
    def create(cls, model: torch.nn.Module) -> SharedWeights:
        """A new file (in /dev/shm where there is one) holding the policy's weights now."""
        layout, size = [], 0
        for name, tensor in policy_weights(model, device="cpu"):
            dtype = str(tensor.dtype).removeprefix("torch.")
            layout.append((name, dtype, tuple(tensor.shape), size))
            size += -(-_nbytes(dtype, tensor.shape) // _ALIGN) * _ALIGN
        shared = cls(layout, _reserve(size), size)
        shared.write(model, None)
        return shared

    def write(self, model: torch.nn.Module, only: set[str] | None) -> list[str]:
        """Copy the policy's weights (`only` these names) in; returns the names written."""
        names = []
        for name, tensor in policy_weights(model, only=only, device="cpu"):
            self.views[name].copy_(tensor)
            names.append(name)
        return names

    def unlink(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)


def _reserve(size: int) -> str:
    """A new file of `size` bytes, its blocks allocated up front (so a full file system is an
    error here, not a SIGBUS when a weight is written): in /dev/shm where it has the room (a
    container's is often 64 MB), else in the temporary directory."""
    tried = []
    for where in ("/dev/shm", tempfile.gettempdir()):
        if not os.access(where, os.W_OK):
            continue
        fd, path = tempfile.mkstemp(prefix="rlvr-weights-", dir=where)
        try:
            os.posix_fallocate(fd, 0, max(size, 1))
            return path
        except OSError as e:
            tried.append(f"{where}: {e.strerror}")
            os.unlink(path)
        finally:
            os.close(fd)
    raise ServerError(
        f"rollout server: no room for the {size / 2**20:.0f} MiB of shared weights "
        f"({'; '.join(tried) or 'no writable /dev/shm or temporary directory'}); "
        "set TMPDIR to a file system with room"
    )


def _nbytes(dtype: str, shape) -> int:
    return getattr(torch, dtype).itemsize * torch.Size(shape).numel()


class ServerEngine:
    """The engine `rollout.engine` names, run by the server process (the module docstring).

    It reports sampling log-probs: its engine is fast or vllm (`rlvr.config.placement`
    refuses the server with hf), and both do. It pins weights (`pinned`), and `close` ends
    its process."""

    reports_log_probs: ClassVar[bool] = True
    pins_weights: ClassVar[bool] = True

    def __init__(self, model, *, pad_id: int, eos_ids: list[int], cfg: Config, site: EngineSite):
        self.model = model
        self.changing = trainable_names(model)
        self._lock = threading.Lock()
        self._stale = False  # the policy changed since the server last received its weights
        self._pins = 0
        self.shared = SharedWeights.create(model)
        inner = replace(cfg, rollout=replace(cfg.rollout, server=replace(cfg.rollout.server, enabled=False)))  # fmt: skip
        cpus = cfg.rollout.server.cpus
        start = {
            "cfg": inner,
            "model_config": _base(model).config,
            "layout": self.shared.layout,
            "changing": sorted(self.changing),
            "path": self.shared.path,
            "size": self.shared.size,
            "pad_id": pad_id,
            "eos_ids": list(eos_ids),
            "site": replace(site, backend=None, device=_server_device(cfg, site)),
            "cpus": sorted(parse_cpus("rollout.server.cpus", cpus)) if cpus else None,
            "threads": torch.get_num_threads(),  # without cpus: as many as the trainer's
        }
        ours, theirs = socket.socketpair()
        # a process of its own, not a rank of the trainer's group: none of torchrun's (or an
        # earlier in-process vLLM's) rendezvous variables, whose port is taken
        env = {k: v for k, v in os.environ.items() if k not in _LAUNCH_VARS}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "rlvr.rollout.server_main", str(theirs.fileno()), str(os.getpid())],
            pass_fds=[theirs.fileno()],
            stdin=subprocess.DEVNULL,
            env=env,
        )  # fmt: skip
        theirs.close()
        self.conn = Connection(ours.detach())
        self.helper = Helper("rollout server", self.proc.pid, self.proc, _RESUME, ServerError)
        self._lost = False  # a request failed on the process: close() kills it at once
        try:
            ready = self._ask("start", start)
        except BaseException:
            self.close()  # no engine to close later: the process ends here
            raise
        finally:
            self.shared.unlink()  # both ends hold it mapped: the memory goes with the last
        # the shared file and the server's own copy of the weights, with what its engine holds
        self.resident_bytes = int(ready["resident_bytes"]) + 2 * self.shared.size

    @classmethod
    def from_config(
        cls, model, *, pad_id: int, eos_ids: list[int], cfg: Config, site: EngineSite
    ) -> ServerEngine:
        check_ranks(cfg, site.world_size)  # one trainer process only
        return cls(model, pad_id=pad_id, eos_ids=eos_ids, cfg=cfg, site=site)

    def _ask(self, kind: str, payload: Any = None) -> Any:
        """Send one request and wait for its answer as long as the server runs (no deadline);
        ServerError naming the server when it dies or stays stopped meanwhile."""
        with self._lock:
            try:
                self._send(pickle.dumps((kind, payload)), kind)
                wait_until(self.conn.poll, self.helper, _DOING[kind])
                status, value = pickle.loads(self.conn.recv_bytes())
            except (EOFError, OSError):
                self._lost = True
                raise self._how_it_ended(kind) from None
            except ServerError:
                self._lost = True
                raise
        if status != "ok":
            raise ServerError(f"rollout server: {kind} failed: {value}")
        return value

    def _send(self, data: bytes, kind: str) -> None:
        """One request's bytes, sent while the server runs (`_DIRECT_BYTES`)."""
        if len(data) <= _DIRECT_BYTES:
            self.conn.send_bytes(data)
            return
        failed: list[Exception] = []

        def send() -> None:
            try:
                self.conn.send_bytes(data)
            except Exception as e:  # raised in the caller's thread (closed by close(): ignored)
                failed.append(e)

        sender = threading.Thread(target=send, name="rlvr-server-send", daemon=True)
        sender.start()
        wait_until(lambda s: not (sender.join(s) or sender.is_alive()), self.helper, _DOING[kind])
        if failed:
            raise failed[0]

    def _how_it_ended(self, kind: str) -> ServerError:
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=5)
        how = self.helper.ended() or "closed its socket"
        return self.helper.lost(how, _DOING[kind])

    def sync_weights(self) -> None:
        """After an optimiser step: the server receives the new weights before its next
        request that is not pinned."""
        self._stale = True

    @contextlib.contextmanager
    def pinned(self):
        """The server keeps sampling with the weights it has (a batch ahead of the update)."""
        self._push()
        self._pins += 1
        try:
            yield
        finally:
            self._pins -= 1

    def _push(self) -> None:
        if self._stale:
            names = self.shared.write(self.model, self.changing)
            self._ask("weights", names)
            self._stale = False

    def generate(self, prompt_ids: list[list[int]], params: SamplingParams) -> Rollout:
        if not self._pins:
            self._push()
        return self._ask("generate", (prompt_ids, params))

    def release(self) -> None:
        self._ask("release")

    def close(self) -> None:
        """End the server: it exits when its socket closes (killed at once when lost). A
        second call finds it ended and does nothing more."""
        with contextlib.suppress(OSError):
            self.conn.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=0 if self._lost else 10)
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def step_metrics(self) -> dict[str, float]:
        """No counters of its own (its process's health ends the run when lost)."""
        return {}

    def __del__(self):
        with contextlib.suppress(Exception):
            self.close()
