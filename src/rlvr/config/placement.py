"""Where a run's processes go, checked before any starts: the data-parallel ranks a config
allows (`check_ranks`), and the rollout server's CPU lists and device (`validate_server`,
`parse_cpus`, which the server also uses to pin itself)."""

from __future__ import annotations

import os

from rlvr.config.schema import Config, ConfigError

# The CPUs this process could run on before `pin_trainer` narrowed them: the server may use any.
_AVAILABLE = frozenset(os.sched_getaffinity(0))


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
    if r.server.enabled:
        raise ConfigError(
            f"rollout.server: one trainer process only (got {world_size} ranks under "
            "torchrun); run without rollout.server.enabled"
        )


def parse_cpus(key: str, text: str) -> set[int]:
    """The CPUs of a list like "0", "0-3,8" (`rollout.server.cpus`); ConfigError naming `key`
    for anything else, or for a CPU this process may not run on."""
    cpus: set[int] = set()
    try:
        for part in filter(None, (p.strip() for p in text.split(","))):
            lo, _, hi = part.partition("-")
            cpus.update(range(int(lo), int(hi or lo) + 1))
    except ValueError:
        raise ConfigError(f"{key}: got {text!r}, expected CPUs like 0 or 0-3,8") from None
    if not cpus or not cpus <= _AVAILABLE:
        raise ConfigError(
            f"{key}: got {text!r}, expected CPUs among those this process may use "
            f"({_cpu_text(_AVAILABLE)})"
        )
    return cpus


def validate_server(cfg: Config) -> None:
    """`rollout.server.*` (docs/async.md): CPU lists that parse, none set while the server is
    off (they would do nothing), a device this machine has."""
    server = cfg.rollout.server
    for key in ("cpus", "trainer_cpus", "device"):
        text = getattr(server, key)
        if text and not server.enabled:
            raise ConfigError(
                f"rollout.server.{key}: got {text!r}, but rollout.server.enabled is false "
                "(it places the server's process): enable the server or leave it empty"
            )
    for key in ("cpus", "trainer_cpus"):
        if getattr(server, key):
            parse_cpus(f"rollout.server.{key}", getattr(server, key))
    if server.device:
        _check_device(server.device)


def _check_device(name: str) -> None:
    import torch  # here: only a config that names a device needs it

    try:
        device = torch.device(name)
    except RuntimeError:
        raise ConfigError(
            f"rollout.server.device: got {name!r}, expected a torch device such as cpu or cuda:1"
        ) from None
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if device.type == "cuda" and (device.index or 0) >= count:
        raise ConfigError(
            f"rollout.server.device: {name!r} asked for, but this machine has {count} CUDA devices"
        )


def _cpu_text(cpus: set[int]) -> str:
    return ",".join(map(str, sorted(cpus)))
