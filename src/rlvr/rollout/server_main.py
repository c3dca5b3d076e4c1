"""The rollout server's process (rlvr.rollout.server): `python -m rlvr.rollout.server_main FD
PARENT_PID`, started by `ServerEngine` with one end of a socket pair as FD.

It builds the base model from the trainer's config (no files read), copies the weights from
the shared file the trainer wrote, builds `rollout.engine` on that model (`build_engine`, as
the trainer would in process) and then answers requests until the socket closes:

    ("weights", names)            copy these from the shared file, then engine.sync_weights()
    ("generate", (prompts, params))   engine.generate(...) -> Rollout
    ("release", None)             engine.release()

each with ("ok", value) or ("error", "Type: message"). It runs nothing it is sent: the
messages are this package's own types, pickled by the trainer that started it.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import pickle
import signal
import sys
import traceback
from multiprocessing.connection import Connection

_PR_SET_PDEATHSIG = 1


def _die_with_parent(parent: int) -> None:
    """SIGKILL when the trainer dies (also a trainer killed before this line: checked)."""
    with contextlib.suppress(OSError, AttributeError):  # not Linux: the socket's EOF still ends it
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:
        os._exit(0)


def _start(msg: dict):
    """The model and engine from the trainer's start message; returns (engine, copy)."""
    cpus = msg["cpus"]
    cfg = msg["cfg"]
    if cpus:
        os.sched_setaffinity(0, cpus)
        if cfg.rollout.engine == "vllm":  # vLLM's CPU worker binds its own OpenMP threads
            os.environ["VLLM_CPU_OMP_THREADS_BIND"] = ",".join(map(str, cpus))
    import torch
    from transformers import AutoModelForCausalLM

    from rlvr.rollout.registry import engine_from_ids
    from rlvr.rollout.server import SharedWeights

    torch.set_num_threads(len(cpus) if cpus else msg["threads"])
    site = msg["site"]
    shared = SharedWeights(msg["layout"], msg["path"], msg["size"])
    config = msg["model_config"]
    dtype = next(iter(shared.views.values())).dtype if shared.views else torch.float32
    with torch.device(site.device or "cpu"):
        model = AutoModelForCausalLM.from_config(config).to(dtype)
    model.eval()
    params = dict(model.named_parameters())
    for name, param in params.items():  # what training changes, as the trainer's engine sees it
        param.requires_grad_(name in msg["changing"])

    def copy(names) -> None:
        with torch.no_grad():
            for name in names:
                params[name].copy_(shared.views[name])

    copy(list(shared.views))
    engine = engine_from_ids(cfg, model, msg["pad_id"], msg["eos_ids"], site)
    return engine, copy


def serve(conn: Connection) -> None:
    _, msg = pickle.loads(conn.recv_bytes())  # the "start" request
    try:
        engine, copy = _start(msg)
        reply = ("ok", {"resident_bytes": engine.resident_bytes})
    except Exception as e:  # the trainer reports it, one line naming the server
        conn.send_bytes(pickle.dumps(("error", _text(e))))
        return
    conn.send_bytes(pickle.dumps(reply))
    try:
        _answer(conn, engine, copy)
    finally:
        engine.close()


def _answer(conn: Connection, engine, copy) -> None:
    """Answer the trainer's requests until it closes its end."""
    while True:
        try:
            kind, payload = pickle.loads(conn.recv_bytes())
        except (EOFError, OSError):
            return  # the trainer closed its end or is gone
        try:
            if kind == "weights":
                copy(payload)
                engine.sync_weights()
                value = None
            elif kind == "generate":
                value = engine.generate(*payload)
            elif kind == "release":
                value = engine.release()
            else:
                raise ValueError(f"unknown request {kind!r}")
            conn.send_bytes(pickle.dumps(("ok", value)))
        except Exception as e:
            conn.send_bytes(pickle.dumps(("error", _text(e))))


def _text(e: BaseException) -> str:
    where = traceback.extract_tb(e.__traceback__)[-1:] if e.__traceback__ else []
    at = f" (at {where[0].filename}:{where[0].lineno})" if where else ""
    return f"{type(e).__name__}: {e}{at}"


def main() -> None:
    fd, parent = int(sys.argv[1]), int(sys.argv[2])
    _die_with_parent(parent)
    # Ctrl-C reaches the whole process group: the trainer stops at the step's end (saving a
    # checkpoint) and closes the socket; the server must not die mid-request before that.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    serve(Connection(fd))


if __name__ == "__main__":
    main()
