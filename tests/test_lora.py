"""LoRA through PEFT: only adapter weights train, the reference is the adapter switched off
(no second copy), checkpoints hold the adapter, and `rlvr export --merge` gives a plain model."""

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from rlvr.cli.main import main
from rlvr.config.load import load_config
from rlvr.models import load_model, load_tokenizer
from rlvr.training.batch import Sample, collate, token_log_probs
from rlvr.training.policy import load_policy

pytest.importorskip("peft")

USER_REWARD = f"{Path(__file__).parent / 'e2e_rewards.py'}:digit_share=1.0"
FAST = [
    "--rollout.prompts_per_step=4",
    "--rollout.group_size=4",
    "--rollout.max_new_tokens=12",
    "--train.eval_size=8",
    "--data.train_size=64",
    "--optim.lr=1e-2",
    "--no-progress",
]


def test_two_lora_steps_train_only_the_adapter_and_export_merges(tiny_model_dir, tmp_path):
    run = tmp_path / "run"
    rc = main(
        [
            "train",
            "--preset",
            "grpo",
            f"--model.name_or_path={tiny_model_dir}",
            "--model.lora_rank=4",
            f"--reward.extra={USER_REWARD}",
            "--max-steps",
            "2",
            "--output-dir",
            str(run),
            *FAST,
        ]
    )
    assert rc == 0
    summary = json.loads((run / "summary.json").read_text())
    assert summary["reference"] == "adapter-disabled"  # kl_coef 0.04, yet no second model
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert rows[1]["kl"] > 0  # the adapter moved the policy away from the base

    ckpt = run / "checkpoints" / "step-000002"
    assert (ckpt / "adapter_config.json").is_file()
    assert not (ckpt / "model.safetensors").exists()  # the adapter only, not the base
    adapter = load_file(str(ckpt / "adapter_model.safetensors"))
    assert adapter and all("lora_" in k for k in adapter)
    assert any(v.abs().sum() > 0 for k, v in adapter.items() if "lora_B" in k)  # B starts at 0

    out = tmp_path / "merged"
    assert main(["export", str(run), "--merge", "--output", str(out)]) == 0
    merged = load_model(str(out)).eval()
    base = load_file(str(tiny_model_dir / "model.safetensors"))
    state = merged.state_dict()
    assert set(base) <= set(state)
    moved = [k for k in base if not torch.equal(base[k], state[k])]
    assert moved and all(k.endswith("proj.weight") for k in moved)  # only adapted matrices
    tok = load_tokenizer(str(out))
    ids = tok("Compute 1+2.", return_tensors="pt")["input_ids"]
    gen = merged.generate(ids, max_new_tokens=4, do_sample=False, pad_token_id=tok.pad_token_id)
    assert gen.shape[1] > ids.shape[1]


def test_export_without_merge_refuses_an_adapter(tiny_model_dir, tmp_path, capsys):
    run = tmp_path / "run"
    assert (
        main(
            [
                "train",
                f"--model.name_or_path={tiny_model_dir}",
                "--model.lora_rank=2",
                "--preset",
                "grpo",
                "--algo.kl_coef=0",
                "--max-steps",
                "1",
                "--output-dir",
                str(run),
                *FAST,
            ]
        )
        == 0
    )
    assert main(["export", str(run), "--output", str(tmp_path / "x")]) == 2
    assert "pass --merge" in capsys.readouterr().err


def test_reference_is_the_base_with_the_adapter_off(tiny_model_dir):
    cfg = load_config(
        None, {"preset": "grpo", "model": {"name_or_path": str(tiny_model_dir), "lora_rank": 4}}
    )
    policy = load_policy(cfg, None, torch.device("cpu"))
    for name, p in policy.model.named_parameters():  # make the adapter non-trivial
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.5)
    base = load_model(str(tiny_model_dir)).eval()
    mb = collate([Sample([5, 6, 7], [8, 9, 10], False, 0.0, False, 0)], pad_id=0, device="cpu")
    with torch.no_grad():
        with policy.reference() as ref:
            ref_lp, _ = token_log_probs(ref, mb, temperature=1.0)
        live_lp, _ = token_log_probs(policy.model, mb, temperature=1.0)
        base_lp, _ = token_log_probs(base, mb, temperature=1.0)
    torch.testing.assert_close(ref_lp, base_lp)
    assert not torch.allclose(live_lp, base_lp)
    trainable = [n for n, p in policy.model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
