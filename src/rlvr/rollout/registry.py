"""The registry of rollout engines and the one place an engine is built.

`rollout.engine` names an entry of `ENGINES`; `build_engine` builds it for training (`rlvr
train`), `rlvr eval` and `rlvr rm` alike: the config's settings (the engine's own section,
`rollout.vllm.*`), the caller's `EngineSite` (device, ranks, tools, the longest sequence
and the rows a call holds) and the model's pad and EOS ids. An engine is a class with the
`RolloutEngine` methods (`base.py`), its `from_config` included; adding one is its module
and its entry here (docs/guides/architecture.md, "Adding an engine").
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rlvr.config.schema import ConfigError
from rlvr.models import eos_ids
from rlvr.rollout.base import EngineError, EngineSite, RolloutEngine
from rlvr.rollout.fast import FastEngine
from rlvr.rollout.hf import HFEngine
from rlvr.rollout.vllm import VLLMEngine  # imports vllm only when constructed
from rlvr.rollout.vllm_server import VLLMServerEngine  # imports vllm only when constructed

if TYPE_CHECKING:
    from rlvr.config.schema import Config

ENGINES: dict[str, type[RolloutEngine]] = {"fast": FastEngine, "hf": HFEngine, "vllm": VLLMEngine}


def reporting_log_probs() -> list[str]:
    """The engines that report their sampling log-probs (`RolloutEngine.reports_log_probs`)."""
    return [name for name, engine in ENGINES.items() if engine.reports_log_probs]


def build_engine(cfg: Config, model, tokenizer, site: EngineSite | None = None) -> RolloutEngine:
    """The engine `cfg.rollout.engine` names, on `model`, for the caller's `site`. An engine
    that cannot run here (`EngineError`, its message naming the key) or fails to build is
    a `ConfigError` naming rollout.engine. Under rollout.vllm.mode=server the
    vllm engine generates on vLLM servers (`rlvr.rollout.vllm_server`)."""
    pad, eos = tokenizer.pad_token_id, eos_ids(tokenizer, model)
    return engine_from_ids(cfg, model, pad, eos, site or EngineSite())


def engine_from_ids(
    cfg: Config, model, pad_id: int, eos: list[int], site: EngineSite
) -> RolloutEngine:
    """`build_engine` once the pad and EOS ids are known (a caller with the ids and no
    tokenizer)."""
    cls = ENGINES[cfg.rollout.engine]
    if cls is VLLMEngine and cfg.rollout.vllm.mode == "server":
        cls = VLLMServerEngine  # vLLM's own servers (rollout.vllm.urls or launch)
    try:
        return cls.from_config(model, pad_id=pad_id, eos_ids=eos, cfg=cfg, site=site)
    except EngineError as e:  # no GPU, no or unsupported library, the engine failed to start
        raise ConfigError(str(e)) from None
    except RuntimeError as e:
        raise ConfigError(f"rollout.engine: {e}") from None


def longest_sequence(cfg: Config, model, source) -> int | None:
    """The longest sequence a run asks of an engine: its longest prompt (train or eval) plus
    the response budget (with tools, the whole response's), within the model's context;
    None without prompts (`source` None)."""
    if source is None:
        return None
    prompts = [*source.train, *source.eval]
    longest = max((len(p.ids) for p in prompts), default=0)
    r = cfg.rollout
    budget = r.max_total_tokens if r.tools and r.max_total_tokens else r.max_new_tokens
    context = getattr(model.config, "max_position_embeddings", None)
    return longest + budget if context is None else min(context, longest + budget)
