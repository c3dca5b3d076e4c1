"""rlvr's vLLM general plugin: registers the `rlvr_http` weight-transfer backend
(`rlvr.rollout.vllm_weights`) with vLLM's worker-side and trainer-side factories.

vLLM calls `register` in each of its processes (the `vllm.general_plugins` entry point in
pyproject.toml) before it builds an engine, so a `vllm serve` process started with
`--weight-transfer-config '{"backend": "rlvr_http"}'` in an environment where rlvr is installed
can receive the trainer's weights. Registration names a module path, not a class: nothing of
rlvr is imported until the backend is used. It may run more than once in a process (vLLM's
`load_general_plugins` and rlvr's server engine both call it) and registers each side once.
"""

from __future__ import annotations

BACKEND = "rlvr_http"
_MODULE = "rlvr.rollout.vllm_weights"


def register() -> None:
    from vllm.distributed.weight_transfer.factory import (
        WeightTransferEngineFactory,
        WeightTransferTrainerFactory,
    )

    if BACKEND not in WeightTransferEngineFactory._registry:
        WeightTransferEngineFactory.register_engine(BACKEND, _MODULE, "HTTPWeightEngine")
    if BACKEND not in WeightTransferTrainerFactory._registry:
        WeightTransferTrainerFactory.register_engine(BACKEND, _MODULE, "HTTPWeightSender")
