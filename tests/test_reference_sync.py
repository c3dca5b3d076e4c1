"""Reference resets (algo.ref_sync_every, algo.ref_mixup_alpha): ref <- alpha * policy +
(1 - alpha) * ref by formula for a full policy and under LoRA, the state a checkpoint keeps,
refusals by name, and a killed run resumed across resets equal to the uninterrupted one."""

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rlvr import cpu
from rlvr.config.load import load_config
from rlvr.config.schema import ConfigError
from rlvr.models import load_model
from rlvr.training.batch import Sample, collate, token_log_probs
from rlvr.training.policy import load_policy
from rlvr.training.reference import ReferenceSync, mix_
from same_run import Tolerance, assert_same_run, assert_same_weights

USER = f"{Path(__file__).parent / 'e2e_rewards.py'}:digit_share=1.0"


def _policy(model_dir, **model):
    cfg = load_config(None, {"preset": "grpo", "model": {"name_or_path": str(model_dir), **model}})
    return load_policy(cfg, None, torch.device("cpu"))


def _perturb(model, std=0.05, seed=1):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.add_(torch.randn(p.shape, generator=g) * std)


def _log_probs(model):
    mb = collate([Sample([5, 6, 7], [8, 9, 10, 11], False, 0.0, False, 0)], pad_id=0, device="cpu")
    with torch.no_grad():
        return token_log_probs(model, mb, temperature=1.0)[0]


def test_mix_by_formula_hard_soft_and_tied_weights_once():
    r0, p = torch.tensor([1.0, -2.0, 4.0]), torch.tensor([3.0, 0.0, -4.0])
    ref = {"a": r0.clone(), "tied": r0.clone(), "steps": torch.tensor([7])}
    ref["tied_too"] = ref["tied"]  # one tensor under two names, as tied embeddings are
    pol = {"a": p, "tied": p, "tied_too": p, "steps": torch.tensor([9])}
    mix_(ref, pol, 0.25)
    expected = torch.tensor([0.25 * 3 + 0.75 * 1, 0.25 * 0 + 0.75 * -2, 0.25 * -4 + 0.75 * 4])
    assert torch.equal(ref["a"], expected)  # [1.5, -1.5, 2.0]: exact in binary
    assert torch.equal(ref["tied"], expected)  # mixed once, not twice
    assert int(ref["steps"]) == 9  # integer buffers are copied
    mix_(ref, pol, 1.0)
    assert torch.equal(ref["a"], p)  # hard: an exact copy
    with pytest.raises(KeyError, match="no weights"):
        mix_({"b": r0.clone()}, pol, 1.0)


@pytest.mark.parametrize("alpha", [1.0, 0.6])
def test_reset_of_a_full_copy_by_formula(tiny_model_dir, alpha):
    policy = _policy(tiny_model_dir)
    start = {k: v.clone() for k, v in policy.reference_copy.state_dict().items()}
    _perturb(policy.model)
    sync = ReferenceSync(policy, cpu.OFF, alpha)
    sync.reset()
    live = policy.model.state_dict()
    for k, r in policy.reference_copy.state_dict().items():
        want = live[k] if alpha == 1 else alpha * live[k] + (1 - alpha) * start[k]
        torch.testing.assert_close(r, want, rtol=0, atol=1e-7)
    assert not any(p.requires_grad for p in policy.reference_copy.parameters())
    if alpha == 1:
        assert torch.equal(_log_probs(policy.reference_copy), _log_probs(policy.model))


@pytest.mark.parametrize("alpha", [1.0, 0.5])
def test_lora_reset_materialises_the_merged_policy_and_leaves_the_policy(tiny_model_dir, alpha):
    pytest.importorskip("peft")
    policy = _policy(tiny_model_dir, lora_rank=4)
    assert policy.reference_copy is None  # before a reset: the base, adapters off
    for name, p in policy.model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.3)
    before = _log_probs(policy.model)
    adapters = {k: v.clone() for k, v in policy.model.state_dict().items() if "lora_" in k}
    ReferenceSync(policy, cpu.OFF, alpha).reset()
    assert torch.equal(_log_probs(policy.model), before)  # the policy did not move
    after = {k: v for k, v in policy.model.state_dict().items() if "lora_" in k}
    assert all(torch.equal(adapters[k], after[k]) for k in adapters)
    merged = load_model(str(tiny_model_dir))
    base = merged.state_dict()
    # merged by hand: W + (alpha_lora / r) B A on every adapted linear
    scale = policy.model.peft_config["default"].lora_alpha / 4
    by_hand = {k: v.clone() for k, v in base.items()}
    for name, mod in policy.model.named_modules():
        if hasattr(mod, "lora_A") and "default" in mod.lora_A:
            key = name.split("base_model.model.", 1)[1] + ".weight"
            delta = mod.lora_B["default"].weight @ mod.lora_A["default"].weight
            by_hand[key] = base[key] + scale * delta
    ref = policy.reference_copy.state_dict()
    for k, v in by_hand.items():
        want = v if alpha == 1 else alpha * v + (1 - alpha) * base[k]
        torch.testing.assert_close(ref[k], want, rtol=0, atol=1e-6)
    with policy.reference() as reference:
        assert reference is policy.reference_copy


@pytest.mark.compares_runs
def test_state_restores_the_reset_reference_exactly(tiny_model_dir):
    pytest.importorskip("peft")
    for model in ({}, {"lora_rank": 4}):
        policy = _policy(tiny_model_dir, **model)
        _perturb(policy.model, std=0.3)
        sync = ReferenceSync(policy, cpu.OFF, 0.5)
        assert sync.state() == {"resets": 0, "weights": None}  # reconstructible: nothing kept
        sync.reset()
        state = sync.state()
        fresh = _policy(tiny_model_dir, **model)
        ReferenceSync(fresh, cpu.OFF, 0.5).load_state(state)
        a, b = policy.reference_copy.state_dict(), fresh.reference_copy.state_dict()
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_a_reset_without_a_reference_is_refused_by_name():
    with pytest.raises(ConfigError, match=r"algo.ref_sync_every: .*kl_coef is 0"):
        load_config(None, {"algo": {"ref_sync_every": 5}})  # dapo: kl_coef 0
    with pytest.raises(ConfigError, match=r"algo.ref_mixup_alpha: .*in \(0, 1\]"):
        load_config(None, {"preset": "grpo", "algo": {"ref_sync_every": 5, "ref_mixup_alpha": 0}})
    with pytest.raises(ConfigError, match=r"algo.ref_mixup_alpha: .*unless the reference"):
        load_config(None, {"preset": "grpo", "algo": {"ref_mixup_alpha": 0.5}})
    cfg = load_config(
        None, {"preset": "grpo", "algo": {"ref_sync_every": 5, "ref_mixup_alpha": 0.5}}
    )
    assert cfg.algo.ref_sync_every == 5


def _args(model_dir, run, *extra):
    return [sys.executable, "-m", "rlvr", "train", "--preset", "grpo",
            f"--model.name_or_path={model_dir}", "--algo.ref_sync_every=2", f"--reward.extra={USER}",
            "--algo.ref_mixup_alpha=0.5", "--rollout.prompts_per_step=4",
            "--rollout.group_size=4", "--rollout.max_new_tokens=10", "--train.eval_size=8",
            "--data.train_size=64", "--optim.lr=1e-2", "--train.threads=1", "--save-every", "1",
            "--max-steps", "5", "--output-dir", str(run), "--no-progress", *extra]  # fmt: skip


def _rows(run):
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith("time/") and k != "tokens_per_s"}
            for r in rows]  # fmt: skip


@pytest.mark.compares_runs
@pytest.mark.slow
@pytest.mark.parametrize("lora", [False, True])
def test_killed_between_resets_resumes_to_the_same_run(tiny_model_dir, tmp_path, lora):
    extra = ["--model.lora_rank=4"] if lora else []
    whole = tmp_path / "whole"
    res = subprocess.run(_args(tiny_model_dir, whole, *extra), capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    rows = _rows(whole)
    assert [r.get("ref/reset") for r in rows] == [None, 1.0, None, 1.0, None]
    run = tmp_path / "killed"
    proc = subprocess.Popen(_args(tiny_model_dir, run, *extra), stderr=subprocess.PIPE, text=True)
    ckpt = run / "checkpoints" / "step-000003"  # after a reset, before the next
    while not ckpt.is_dir():
        assert proc.poll() is None, proc.stderr.read()
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    cmd = [sys.executable, "-m", "rlvr", "train", "--resume", str(run), "--trust-run-code"]
    cmd.append("--no-progress")
    res = subprocess.run(cmd, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert _rows(run) == rows  # bit for bit, kl included: the reference came back exactly


def _ranks(model_dir, run, nproc, parallel):
    from test_distributed import _run_group

    args = _args(model_dir, run, "--nproc", str(nproc), f"--train.parallel={parallel}",
                 "--algo.ref_sync_every=1", "--rollout.seed_per_prompt=true",
                 "--optim.lr=1e-3", "--max-steps", "3", "--train.keep_checkpoints=5")  # fmt: skip
    rc, err = _run_group(args)
    assert rc == 0, err[-3000:]
    return run


@pytest.mark.slow
@pytest.mark.parametrize("parallel", ["ddp", "fsdp2"])
def test_two_ranks_reset_the_reference_as_one_process(tiny_model_dir, tmp_path, parallel):
    one = _ranks(tiny_model_dir, tmp_path / "one", 1, "ddp")
    two = _ranks(tiny_model_dir, tmp_path / "two", 2, parallel)
    m1, m2 = _rows(one), _rows(two)
    assert [r.get("ref/reset") for r in m2] == [1.0, 1.0, 1.0]
    kl = Tolerance(
        rel=1e-3,
        abs=1e-7,
        why="a mean of differences of nearly equal log-probs (the reference was just reset): "
        "each log-prob's rounding is a larger share of it than of a loss",
    )
    assert_same_run(m1, m2, floats={"kl": kl}, keys=["kl"])
    for step in (1, 2, 3):
        s1, s2 = (torch.load(r / "checkpoints" / f"step-{step:06d}" / "trainer_state.pt",
                             weights_only=False)["outer"]["reference"] for r in (one, two))  # fmt: skip
        assert s1["resets"] == s2["resets"] == step
        assert_same_weights(s1["weights"], s2["weights"], where=f"step {step}")


def test_lora_adapters_start_from_the_run_seed(tiny_model_dir):
    """A LoRA run starts from the same adapters every time (the resets' resume test needs it)."""
    pytest.importorskip("peft")

    def adapters(seed):
        cfg = load_config(None, {"preset": "grpo", "train": {"seed": seed},
                                 "model": {"name_or_path": str(tiny_model_dir), "lora_rank": 4}})  # fmt: skip
        torch.manual_seed(seed + 100)  # the global RNG does not decide them
        model = load_policy(cfg, None, torch.device("cpu")).model
        return {k: v for k, v in model.state_dict().items() if "lora_A" in k}

    a, b, c = adapters(0), adapters(0), adapters(1)
    assert a and all(torch.equal(a[k], b[k]) for k in a)
    assert any(not torch.equal(a[k], c[k]) for k in a)
