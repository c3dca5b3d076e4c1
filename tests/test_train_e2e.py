"""End to end on a real (tiny, random) Qwen2 given by path, through the command line."""

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from rlvr.cli.main import main

USER_REWARD = f"{Path(__file__).parent / 'e2e_rewards.py'}:digit_share=1.0"
FAST = [
    "--rollout.prompts_per_step=4",
    "--rollout.group_size=4",
    "--rollout.max_new_tokens=12",
    "--train.eval_size=8",
    "--data.train_size=64",
    "--optim.lr=1e-3",
    "--no-progress",
]


def _weights(path):
    return load_file(str(path / "model.safetensors"))


def test_two_steps_on_a_local_qwen2(tiny_qwen2_dir, tmp_path, capsys):
    tiny_model_dir = tiny_qwen2_dir
    run = tmp_path / "run"
    # grpo: KL to a reference (loaded because kl_coef > 0); a user reward loaded by path gives
    # the random model's responses different rewards, hence non-zero advantages.
    rc = main(
        [
            "train",
            "--preset",
            "grpo",
            f"--model.name_or_path={tiny_model_dir}",
            f"--reward.extra={USER_REWARD}",
            "--max-steps",
            "2",
            "--output-dir",
            str(run),
            *FAST,
        ]
    )
    assert rc == 0
    files = {p.relative_to(run).as_posix() for p in run.rglob("*") if p.is_file()}
    ckpt = "checkpoints/step-000002"
    for name in (
        "config.yaml",
        "metrics.jsonl",
        "samples.jsonl",
        "summary.json",
        f"{ckpt}/model.safetensors",
        f"{ckpt}/config.json",
        f"{ckpt}/tokenizer.json",
        f"{ckpt}/trainer_state.pt",
        f"{ckpt}/manifest.json",
    ):
        assert name in files, name
    assert any(f.startswith("tensorboard/events.out.tfevents") for f in files)

    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    assert rows[0]["reward/digit_share"] > 0
    for key in (
        "reward/mean",
        "reward/std",
        "accuracy",
        "groups/all_correct_frac",
        "groups/all_wrong_frac",
        "groups/kept",
        "groups/gen_batches",
        "response/length_mean",
        "response/length_max",
        "response/truncation_rate",
        "entropy",
        "clip_frac_low",
        "clip_frac_high",
        "kl",
        "grad_norm",
        "lr",
        "tokens_per_s",
        "time/generation",
        "time/scoring",
        "time/scoring_wait",
        "time/programs_per_s",
        "time/log_probs",
        "time/update",
        "loss",
    ):
        assert key in rows[0], key
    assert rows[0]["time/scoring_wait"] == rows[0]["time/scoring"]
    assert rows[0]["time/programs_per_s"] == pytest.approx(
        rows[0]["responses"] / rows[0]["time/scoring"], rel=1e-6
    )
    assert rows[0]["groups/kept"] == 4  # no dynamic sampling under grpo
    assert rows[0]["kl"] == pytest.approx(0.0, abs=1e-6)  # step 1: policy == reference
    assert rows[1]["kl"] > 0  # after one update they differ

    samples = [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]
    assert samples and {"step", "prompt", "completion", "reward", "correct"} <= set(samples[0])

    summary = json.loads((run / "summary.json").read_text())
    assert 0 <= summary["eval_before"]["accuracy"] <= 1
    assert summary["eval_after"]["num_prompts"] == 8
    assert summary["steps"] == 2
    assert summary["engine"] == "fast"
    assert summary["native_kernels"] == "on" or summary["native_kernels"].startswith("off: ")
    assert summary["malloc_tuning"] == "on" or summary["malloc_tuning"].startswith("off: ")

    before, after = _weights(tiny_model_dir), _weights(run / ckpt)
    changed = [k for k in before if not torch.equal(before[k], after[k])]
    assert len(changed) > len(before) // 2, "most parameters should have moved"
    out = capsys.readouterr().out
    assert "held-out accuracy:" in out


def test_existing_run_dir_is_not_overwritten(tiny_model_dir, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text("{}\n")
    rc = main(
        [
            "train",
            f"--model.name_or_path={tiny_model_dir}",
            "--output-dir",
            str(run),
            "--max-steps",
            "1",
            *FAST,
        ]
    )
    assert rc == 2
    assert (run / "metrics.jsonl").read_text() == "{}\n"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--data.task=chess"], "data.task: got 'chess'"),
        (["--preset", "nope"], "unknown preset 'nope'"),
        (["--algo.nope=1"], "unknown key algo.nope"),
        (["--algo.clip_low=-0.1"], "algo.clip_low: got -0.1"),
        (["--model.name_or_path=/no/such/model"], "/no/such/model"),
        (["--rollout.max_new_tokens=127"], "exceeds the model's context of 128 tokens"),
    ],
)
def test_bad_input_fails_before_training(tiny_model_dir, tmp_path, capsys, args, message):
    run = tmp_path / "run"
    base = [f"--model.name_or_path={tiny_model_dir}", "--output-dir", str(run), *FAST]
    rc = main(["train", *base, *args])
    assert rc == 2
    assert message in capsys.readouterr().err.replace("\n", "")
    assert not (run / "metrics.jsonl").exists()


def test_report_to_wandb_offline(tiny_model_dir, tmp_path, monkeypatch):
    wandb = pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    run = tmp_path / "run"
    rc = main(
        [
            "train",
            f"--model.name_or_path={tiny_model_dir}",
            "--train.report_to=wandb",
            "--max-steps",
            "1",
            "--output-dir",
            str(run),
            *FAST,
        ]
    )
    assert rc == 0
    offline = list((run / "wandb").glob("offline-run-*"))
    assert offline and any(p.suffix == ".wandb" for p in offline[0].iterdir())
    assert wandb.run is None  # finished


def test_report_to_an_uninstalled_tracker_fails_before_work(tiny_model_dir, tmp_path, capsys):
    import importlib.util

    if importlib.util.find_spec("trackio") is not None:
        pytest.skip("trackio is installed here")
    rc = main(
        [
            "train",
            f"--model.name_or_path={tiny_model_dir}",
            "--train.report_to=trackio",
            "--output-dir",
            str(tmp_path / "run"),
            *FAST,
        ]
    )
    assert rc == 2
    assert "train.report_to: 'trackio' is not installed" in capsys.readouterr().err


def test_eval_reports_avg_pass_and_greedy(tiny_model_dir, capsys):
    rc = main(
        [
            "eval",
            "--model",
            str(tiny_model_dir),
            "--task",
            "arithmetic",
            "--k",
            "2",
            "--num-prompts",
            "8",
            "--max-new-tokens",
            "12",
        ]
    )
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) >= {"avg@2", "pass@2", "greedy_accuracy", "num_prompts"}
    assert 0 <= out["avg@2"] <= out["pass@2"] <= 1 and out["num_prompts"] == 8
