"""Every registered engine built through `build_engine`, the one constructor, with the site each
caller gives it: training (`rlvr.training.setup.engine_site`), `rlvr eval`
(`rlvr.cli.eval.eval_site`) and `rlvr rm` (the default site). vllm is refused by name here
where it is not importable; where it is (the vLLM venv, scripts/vllm_env.sh),
tests/test_vllm_engine.py builds it through `build_engine` with each caller's site."""

import importlib.util
from dataclasses import replace

import pytest
import torch

from rlvr.cli.eval import eval_site
from rlvr.config.load import load_config
from rlvr.config.schema import ConfigError
from rlvr.data.prompts import PromptSource, load_prompts
from rlvr.rollout import (
    ENGINES,
    EngineSite,
    FastEngine,
    HFEngine,
    RolloutEngine,
    SamplingParams,
    VLLMEngine,
    build_engine,
    longest_sequence,
)
from rlvr.run.distributed import Dist
from rlvr.training.setup import Given, build_toolbox, engine_site

HAS_VLLM = importlib.util.find_spec("vllm") is not None
CALLERS = ("train", "eval", "rm")


def _cfg(engine: str, **rollout):
    over = {"rollout": {"engine": engine, "prompts_per_step": 2, "group_size": 3, **rollout}}
    return load_config(None, {**over, "data": {"train_size": 8}, "train": {"eval_size": 4}})


def _site(caller: str, cfg, model, tokenizer, toolbox=None) -> EngineSite:
    """The site `caller` builds its engine with, from the same pieces it has."""
    source = load_prompts(cfg, tokenizer, model.config.max_position_embeddings)
    if caller == "train":
        backend = FastEngine(model, pad_id=0, eos_ids=[0]).backend  # the model's own gate
        site = engine_site(cfg, model, torch.device("cpu"), Dist(), backend, source)
        return replace(site, tools=toolbox)
    if caller == "eval":
        return eval_site(cfg, model, source, toolbox)
    return EngineSite()  # rlvr rm: the model's device, no tools


def test_callers_sites_carry_what_each_caller_knows(tiny_model, tokenizer):
    cfg = _cfg("fast", max_new_tokens=12)
    source = load_prompts(cfg, tokenizer, 128)
    longest = max(len(p.ids) for p in [*source.train, *source.eval])
    train = _site("train", cfg, tiny_model, tokenizer)
    assert train.device == torch.device("cpu") and train.autocast == "none"
    assert train.max_model_len == longest + 12 == longest_sequence(cfg, tiny_model, source)
    assert train.max_rows == 2 * 3 and (train.rank, train.world_size) == (0, 1)
    two = engine_site(cfg, tiny_model, "cpu", Dist(rank=1, world_size=2, local_rank=1), None)
    assert (two.max_rows, two.rank, two.local_rank, two.world_size) == (3, 1, 1, 2)
    assert two.max_model_len is None  # no prompts: the model's own context
    ev = _site("eval", cfg, tiny_model, tokenizer)
    assert ev.device is None and ev.max_rows == 6 and ev.max_model_len == longest + 12
    bf16 = load_config(None, {"model": {"autocast": "bfloat16"}})
    assert engine_site(bf16, tiny_model, "cpu", Dist(), None).autocast == "bfloat16"


@pytest.mark.parametrize("caller", CALLERS)
@pytest.mark.parametrize("name", ["fast", "hf"])
def test_every_caller_builds_the_policy_module_engines(name, caller, tiny_model, tokenizer):
    cfg = _cfg(name)
    engine = build_engine(cfg, tiny_model, tokenizer, _site(caller, cfg, tiny_model, tokenizer))
    assert type(engine) is ENGINES[name] and isinstance(engine, RolloutEngine)
    assert engine.model is tiny_model and engine.tools is None
    assert engine.pad_id == tokenizer.pad_token_id and tokenizer.eos_token_id in engine.eos_ids
    assert engine.resident_bytes == 0
    params = SamplingParams(n=2, max_new_tokens=4, seed=1)
    out = engine.generate([tokenizer.encode("1+2="), tokenizer.encode("3")], params)
    assert out.completion_ids.shape[0] == 4 and (out.lengths <= 4).all()
    engine.release(), engine.sync_weights()  # no-ops on the policy module, callable by all


@pytest.mark.parametrize("name", ["fast", "hf"])
def test_the_sites_tools_and_backend_reach_the_engine(name, tiny_model, tokenizer):
    cfg = _cfg(name, tools=("calc",))
    toolbox = build_toolbox(cfg, PromptSource([], [], None, "none"), tokenizer, Given())
    site = _site("train", cfg, tiny_model, tokenizer, toolbox)
    engine = build_engine(cfg, tiny_model, tokenizer, site)
    assert engine.tools is toolbox
    if name == "fast":
        assert engine.backend is site.backend
    at_eval = eval_site(cfg, tiny_model, None, toolbox)
    assert build_engine(cfg, tiny_model, tokenizer, at_eval).tools is toolbox


@pytest.mark.skipif(HAS_VLLM, reason="vllm is installed: the build itself runs below")
@pytest.mark.parametrize("caller", CALLERS)
def test_vllm_without_vllm_is_a_config_error_naming_the_engine(caller, tiny_model, tokenizer):
    cfg = _cfg("vllm", vllm={"memory": 0.5})
    site = _site(caller, cfg, tiny_model, tokenizer)
    with pytest.raises(ConfigError, match=r"^rollout\.engine=vllm needs vllm: "):
        build_engine(cfg, tiny_model, tokenizer, site)


def test_registry_and_schema_name_the_same_engines():
    from typing import get_args, get_type_hints

    from rlvr.config.schema import RolloutConfig

    assert set(get_args(get_type_hints(RolloutConfig)["engine"])) == set(ENGINES)
    assert {FastEngine, HFEngine, VLLMEngine} == set(ENGINES.values())
    for cls in ENGINES.values():  # the protocol's methods, on the class itself
        for method in ("from_config", "generate", "sync_weights", "release"):
            assert callable(getattr(cls, method)), (cls, method)
