"""The vllm engine: a clear failure where it cannot run; the real checks need a GPU + vllm."""

import importlib.util

import pytest
import torch

from rlvr.rollout import ENGINES, SamplingParams

HAS_GPU_VLLM = torch.cuda.is_available() and importlib.util.find_spec("vllm") is not None


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU message")
def test_fails_at_start_without_a_gpu(tiny_model, tokenizer):
    with pytest.raises(RuntimeError, match=r"rollout\.engine=vllm needs a CUDA GPU"):
        ENGINES["vllm"](tiny_model, pad_id=tokenizer.pad_token_id, eos_ids=[tokenizer.eos_token_id])


def test_train_refuses_vllm_on_cpu_before_any_work(tiny_model_dir, tmp_path, capsys):
    from rlvr.cli import main

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
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
    assert "needs a CUDA GPU" in capsys.readouterr().err


@pytest.mark.skipif(not HAS_GPU_VLLM, reason="needs a CUDA GPU and vllm")
def test_greedy_tokens_match_the_fast_engine(tokenizer):
    from rlvr.models import load_model

    model = load_model("rlvr-tiny", device="cuda").eval()
    kw = dict(pad_id=tokenizer.pad_token_id, eos_ids=[tokenizer.eos_token_id])
    prompts = [tokenizer("Compute 12+34.")["input_ids"], tokenizer("Compute 50-7.")["input_ids"]]
    params = SamplingParams(n=1, max_new_tokens=24, greedy=True)
    a = ENGINES["vllm"](model, **kw).generate(prompts, params)
    b = ENGINES["fast"](model, **kw).generate(prompts, params)
    assert a.lengths.tolist() == b.lengths.tolist()
    assert torch.equal(a.completion_ids, b.completion_ids)
