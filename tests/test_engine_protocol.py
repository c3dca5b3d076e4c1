"""Every engine declares its capabilities on its class (`RolloutEngine`): sampling
log-probs, pinning and closing are read from the class, before an engine is built, and
`pinned` and `close` exist on every engine, so no caller probes with `hasattr`."""

import contextlib
import inspect
import typing

import pytest

from rlvr.rollout import ENGINES, FastEngine, HFEngine, RolloutEngine, SamplingParams
from rlvr.rollout.vllm_server import VLLMServerEngine

EVERY = {**ENGINES, "vllm_server": VLLMServerEngine}
# what each engine declares: (reports_log_probs, pins_weights)
DECLARED = {
    "fast": (True, False),
    "hf": (False, False),
    "vllm": (True, False),
    "vllm_server": (True, True),
}


def test_the_protocol_names_every_capability():
    hints = typing.get_type_hints(RolloutEngine, include_extras=True)
    assert hints["reports_log_probs"] == typing.ClassVar[bool]
    assert hints["pins_weights"] == typing.ClassVar[bool]
    for method in (
        "generate",
        "sync_weights",
        "release",
        "pinned",
        "close",
        "step_metrics",
        "from_config",
    ):
        assert callable(getattr(RolloutEngine, method))


@pytest.mark.parametrize("name", sorted(EVERY))
def test_each_engine_declares_its_capabilities_on_the_class(name):
    cls = EVERY[name]
    assert set(DECLARED) == set(EVERY), "a new engine: say here what it declares"
    declared = (cls.reports_log_probs, cls.pins_weights)
    assert all(type(v) is bool for v in declared)
    assert declared == DECLARED[name]
    for method in ("generate", "sync_weights", "release", "pinned", "close", "step_metrics"):
        assert inspect.isfunction(getattr(cls, method)), method
    assert inspect.ismethod(cls.from_config)


@pytest.mark.parametrize("cls", [FastEngine, HFEngine])
def test_an_engine_on_the_policy_pins_nothing_and_closes_twice(cls, tiny_model, tokenizer):
    """The engines on the policy module: `pinned` is an empty context (sampling inside it
    works as outside), `close` starts and stops nothing, a second call as well."""
    tok = tokenizer
    engine = cls(tiny_model, pad_id=tok.pad_token_id, eos_ids=[tok.eos_token_id])
    assert isinstance(engine, RolloutEngine)
    params = SamplingParams(n=2, max_new_tokens=4, greedy=True)
    prompt = tok("1 + 1 =")["input_ids"]
    outside = engine.generate([prompt], params)
    with engine.pinned() as pinned:
        assert pinned is None
        inside = engine.generate([prompt], params)
    assert inside.completion_ids.tolist() == outside.completion_ids.tolist()
    assert isinstance(engine.pinned(), contextlib.AbstractContextManager)
    engine.close()
    engine.close()
    assert (outside.sampling_log_probs is not None) == cls.reports_log_probs
