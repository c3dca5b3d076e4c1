"""Per-token policy versions (train.inflight_updates, docs/async.md#in-flight-updates): a sample's
version is its oldest token's, `Batch.token_versions` pads them beside the sampling log-probs,
the trained tokens' lags and spreads are what a hand count gives, and the key is refused by
name outside vLLM's server mode or without a staleness bound."""

from __future__ import annotations

import pytest
import torch

from rlvr.training.batch import Batch, Sample
from rlvr.training.inflight import version_metrics


def _sample(versions: list[int] | None, version: int = 0) -> Sample:
    n = len(versions) if versions is not None else 3
    tv = None if versions is None else torch.tensor(versions, dtype=torch.long)
    return Sample([1, 2], list(range(5, 5 + n)), False, 1.0, True, 0,
                  sampling_log_probs=torch.full((n,), -0.5), token_versions=tv, version=version)  # fmt: skip


def test_a_samples_version_is_its_oldest_tokens():
    assert _sample([3, 3, 4, 5]).oldest == 3
    assert _sample(None, version=7).oldest == 7  # no per-token versions: the sample's


def test_batch_pads_token_versions_beside_the_log_probs():
    batch = Batch([_sample([1, 2]), _sample([0, 0, 1])], 1)
    got = batch.token_versions(4)
    assert got.dtype == torch.long
    assert got.tolist() == [[1, 2, 0, 0], [0, 0, 1, 0]]
    assert Batch([_sample([1]), _sample(None)], 1).token_versions(2) is None


def test_version_metrics_by_hand():
    # trainer version 5; tokens 5,5,4 (lags 0,0,1) and 3,4 (lags 2,1): mean 4/5, max 2;
    # spreads 5-4 = 1 and 4-3 = 1: mean 1
    got = version_metrics([_sample([5, 5, 4]), _sample([3, 4])], 5)
    assert got == {"inflight/token_lag_mean": 0.8, "inflight/token_lag_max": 2.0,
                   "inflight/version_spread": 1.0}  # fmt: skip
    # the plain loop
    rows = [[5, 5, 4], [3, 4]]
    lags = [5 - v for r in rows for v in r]
    assert got["inflight/token_lag_mean"] == pytest.approx(sum(lags) / len(lags))
    assert version_metrics([_sample(None)], 5) == {}


def test_inflight_updates_is_refused_by_name_outside_server_mode_and_without_a_bound():
    from rlvr.config.load import load_config
    from rlvr.config.schema import ConfigError

    with pytest.raises(ConfigError, match=r"train\.inflight_updates: .*rollout.engine=vllm"):
        load_config(overrides=["--train.inflight_updates=true"])
    with pytest.raises(ConfigError, match=r"train\.inflight_updates: .*rollout.vllm.mode=colocate"):
        load_config(overrides=["--train.inflight_updates=true", "--rollout.engine=vllm"])


def test_token_versions_from_the_servers_spans():
    from rlvr.rollout.vllm_inflight import generate_body, generated, token_versions

    spans = [{"version": "3", "start": 0, "end": 2}, {"version": "4", "start": 2, "end": 5}]
    assert token_versions(spans, 5) == [3, 3, 4, 4, 4]
    assert token_versions([], 0) == []
    for bad, n in ((spans, 4), (spans[1:], 3), (None, 2)):  # not covering the tokens once
        with pytest.raises(ValueError, match="weight-version spans"):
            token_versions(bad, n, "http://127.0.0.1:9")
    answer = {"choices": [{"token_ids": [7, 8], "weight_versions": spans[:1],
                           "logprobs": {"content": [{"token_id": 7, "logprob": -0.25},
                                                    {"token_id": 8, "logprob": -1.5}]}}]}  # fmt: skip
    assert generated(answer) == ([7, 8], [-0.25, -1.5], [3, 3])
    body = {"model": "m", "prompt": [1, 2], "max_tokens": 4, "temperature": 1.0, "top_p": 1.0,
            "seed": 5, "logprobs": 0, "stop_token_ids": [0], "min_tokens": 0,
            "skip_special_tokens": False}  # fmt: skip
    got = generate_body(body)
    assert got["token_ids"] == [1, 2] and got["sampling_params"]["seed"] == 5
    assert "top_k" not in got["sampling_params"] and got["output_mode"] == "tokens"
