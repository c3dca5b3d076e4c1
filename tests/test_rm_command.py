"""`rlvr rm` end to end on a tiny model: the run directory, summary.json, a model the
`reward_model` reward loads and scores identically, refusals by name, and a SIGKILLed run
resumed to the weights of the uninterrupted one; the iterative loop inside `rlvr train`
resumed mid-iteration equal to the uninterrupted run."""

import json
import signal
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from rlvr.cli.main import main
from rlvr.rewards.registry import make_reward
from rlvr.rm.model import RewardModel
from rlvr.rm.records import read_records

SMALL = ["--rm.train_prompts=12", "--rm.eval_prompts=8", "--rm.samples_per_prompt=4",
         "--rm.batch_groups=4", "--rm.epochs=2", "--rollout.max_new_tokens=10",
         "--train.threads=1", "--no-progress"]  # fmt: skip


def _rm_args(model_dir, run, *extra):
    return ["rm", f"--model.name_or_path={model_dir}", "--output-dir", str(run), *SMALL, *extra]


@pytest.fixture(scope="module")
def rm_run(tiny_model_dir, tmp_path_factory):
    run = tmp_path_factory.mktemp("rm") / "run"
    assert main(_rm_args(tiny_model_dir, run, "--rm.loss=bt", "--rm.save_every=1")) == 0
    return run


def test_rm_run_directory_and_summary(rm_run):
    s = json.loads((rm_run / "summary.json").read_text())
    assert s["train_responses"] == 12 * 4 and s["eval_responses"] == 8 * 4
    assert s["steps"] == 2 * 3 and s["loss"] == "bt"
    assert set(s["eval"]) >= {"accuracy", "auc", "auc_well_formed", "well_formed"}
    rows = [json.loads(x) for x in (rm_run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, 7))
    assert "eval/auc" in rows[2] and "eval/auc" in rows[5]  # each epoch's end
    records = read_records(rm_run / "data" / "train.jsonl")
    assert all("answer" not in r.prompt.lower() or "<answer>" in r.prompt for r in records)
    assert len({r.group for r in records}) == 12


def test_the_reward_model_reward_loads_it_and_scores_the_same(rm_run):
    held_out = read_records(rm_run / "data" / "eval.jsonl")[:6]
    prompts, responses = [r.prompt for r in held_out], [r.response for r in held_out]
    ours = RewardModel.load(rm_run / "model").score(prompts, responses)
    reward = make_reward("reward_model", model=str(rm_run / "model"), batch_size=4)
    theirs = reward(completions=responses, prompt_texts=prompts, prompts=prompts)
    torch.testing.assert_close(torch.tensor(theirs), ours, rtol=0, atol=1e-5)


def test_token_readout_ends_at_the_score_and_starts_at_the_response(rm_run):
    """The head at every position (token_bce trains them all) gives, at each text's last
    token, the classifier's own score; the first response token is where the prompt ends."""
    rm = RewardModel.load(rm_run / "model")
    held_out = read_records(rm_run / "data" / "eval.jsonl")[:5]
    prompts, responses = [r.prompt for r in held_out], [r.response for r in held_out]
    ids, starts = rm.encode_with_starts(prompts, responses)
    with torch.no_grad():
        per_token, mask = rm.forward_tokens(ids)
        last = per_token[torch.arange(len(ids)), mask.sum(1) - 1]
        torch.testing.assert_close(last, rm.forward(ids), rtol=0, atol=1e-5)
    for x, start, p, r in zip(ids, starts, prompts, responses, strict=True):
        assert rm.tokenizer.decode(x[:start]) == p and rm.tokenizer.decode(x[start:]) == r
    short = RewardModel(rm.model, rm.tokenizer, max_length=4)
    ids, starts = short.encode_with_starts(prompts, responses)
    assert all(len(x) == 4 for x in ids) and starts == [0] * len(ids)  # the cut reached them


def test_the_classifier_arch_is_the_backbones_own_class(tiny_model_dir, tmp_path):
    """rm.arch=classifier saves the backbone family's AutoModelForSequenceClassification
    (LlamaForSequenceClassification here), loadable by transformers without rlvr's code."""
    run = tmp_path / "run"
    assert main(_rm_args(tiny_model_dir, run, "--rm.arch=classifier", "--rm.epochs=1")) == 0
    config = json.loads((run / "model" / "config.json").read_text())
    assert config["architectures"] == ["LlamaForSequenceClassification"]
    assert "auto_map" not in config and not list((run / "model").glob("*.py"))


def test_extra_layers_start_as_the_identity(tiny_model_dir):
    """New decoder layers on the backbone add nothing until they train: the last hidden
    states equal the backbone's own, and they are saved as an ordinary deeper classifier."""
    base = RewardModel.from_backbone(str(tiny_model_dir), seed=0)
    deeper = RewardModel.from_backbone(str(tiny_model_dir), seed=0, extra_layers=2)
    n = base.model.config.num_hidden_layers
    assert deeper.model.config.num_hidden_layers == n + 2
    ids = torch.tensor([[5, 9, 14, 3, 7]])
    with torch.no_grad():
        a = base.model.model(input_ids=ids).last_hidden_state
        b = deeper.model.model(input_ids=ids).last_hidden_state
    torch.testing.assert_close(a, b)
    assert deeper.model.model.layers[n].self_attn.q_proj.weight.abs().sum() > 0  # it can learn


def test_bad_rm_keys_are_refused_by_name(tiny_model_dir, tmp_path, capsys):
    assert main(_rm_args(tiny_model_dir, tmp_path / "a", "--rm.loss=hinge")) == 2
    assert (
        "rm.loss: got 'hinge', expected one of 'bce', 'token_bce', 'prefix_bce', 'bt'"
        in capsys.readouterr().err
    )
    assert main(_rm_args(tiny_model_dir, tmp_path / "b", "--rm.bogus=1")) == 2
    assert "unknown key rm.bogus" in capsys.readouterr().err
    assert main(_rm_args(tiny_model_dir, tmp_path / "c", "--rm.extra_layers=-1")) == 2
    assert "rm.extra_layers: got -1, expected >= 0" in capsys.readouterr().err
    assert main(_rm_args(tiny_model_dir, tmp_path / "d", "--rm.extra_layers=1")) == 2
    assert "rm.extra_layers: only rm.arch=classifier" in capsys.readouterr().err
    assert main(_rm_args(tiny_model_dir, tmp_path / "e", "--rm.arch=mlp")) == 2
    assert "rm.arch: got 'mlp', expected one of 'surprise', 'classifier'" in capsys.readouterr().err
    assert main(["rm", "--resume", str(tmp_path)]) == 2
    assert "not an `rlvr rm` run" in capsys.readouterr().err


def _kill_at(cmd, ckpt):
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    while not ckpt.is_dir():
        assert proc.poll() is None, proc.stderr.read()
    proc.send_signal(signal.SIGKILL)
    proc.wait()


@pytest.mark.compares_runs
@pytest.mark.slow
def test_rm_killed_then_resumed_ends_with_the_same_weights(rm_run, tiny_model_dir, tmp_path):
    run = tmp_path / "run"
    args = _rm_args(tiny_model_dir, run, "--rm.loss=bt", "--rm.save_every=1")
    _kill_at([sys.executable, "-m", "rlvr", *args], run / "checkpoints" / "step-000003")
    cmd = [sys.executable, "-m", "rlvr", "rm", "--resume", str(run), "--no-progress"]
    res = subprocess.run(cmd, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert "Loading weights" not in res.stderr and "Writing model shards" not in res.stderr
    a, b = (
        load_file(str(rm_run / "model" / "model.safetensors")),
        load_file(str(run / "model" / "model.safetensors")),
    )
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    sa, sb = (json.loads((r / "summary.json").read_text()) for r in (rm_run, run))
    assert sa["eval"] == sb["eval"]


def _train_args(model_dir, rm, run):
    return [sys.executable, "-m", "rlvr", "train", "--preset", "grpo",
            f"--model.name_or_path={model_dir}", f"--reward.model={rm}",
            "--reward.model_refresh_every=2", "--rollout.prompts_per_step=4",
            "--rollout.group_size=4", "--rollout.max_new_tokens=10", "--train.eval_size=8",
            "--data.train_size=64", "--optim.lr=1e-2", "--train.threads=1", "--save-every", "1",
            "--max-steps", "5", "--output-dir", str(run), "--no-progress"]  # fmt: skip


def _rows(run):
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith("time/") and k != "tokens_per_s"}
            for r in rows]  # fmt: skip


@pytest.mark.compares_runs
@pytest.mark.slow
def test_iterative_loop_resumed_mid_iteration_is_the_same_run(rm_run, tiny_model_dir, tmp_path):
    whole = tmp_path / "whole"
    res = subprocess.run(_train_args(tiny_model_dir, rm_run, whole), capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    rows = _rows(whole)
    assert [r.get("rm/refresh") for r in rows] == [None, 1.0, None, 1.0, None]
    assert [r.get("ref/reset") for r in rows] == [None, 1.0, None, 1.0, None]
    assert all(0 <= r["rm/agreement"] <= 1 for r in rows)
    replay = round(0.1 * 12 * 4)  # 10% of the rm run's 48 training responses
    assert rows[1]["rm/replay_responses"] == replay and rows[1]["rm/refresh_responses"] == 32
    run = tmp_path / "killed"
    _kill_at(_train_args(tiny_model_dir, rm_run, run), run / "checkpoints" / "step-000003")
    cmd = [sys.executable, "-m", "rlvr", "train", "--resume", str(run), "--no-progress"]
    res = subprocess.run(cmd, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert _rows(run) == rows  # the reward model, its data and the reference came back exactly


def test_reward_model_keys_are_refused_by_name(tmp_path):
    from rlvr.config.load import load_config
    from rlvr.config.schema import ConfigError

    cases = [
        (
            {"reward": {"model_refresh_every": 5}},
            "reward.model_refresh_every: .*unless reward.model",
        ),
        ({"reward": {"model": str(tmp_path)}}, "reward.model: .*dynamic_sampling"),  # dapo
        ({"reward": {"model": str(tmp_path / "nope")}, "preset": "grpo"}, "does not exist"),
        ({"reward": {"rm_replay_frac": 1.5}, "preset": "grpo"}, r"rm_replay_frac: .*\[0, 1\]"),
    ]
    for changes, message in cases:
        preset = changes.pop("preset", None)
        with pytest.raises(ConfigError, match=message):
            load_config(None, changes, preset=preset)
    cfg = load_config(None, {"reward": {"model": str(tmp_path), "model_refresh_every": 3}},
                      preset="grpo")  # fmt: skip
    assert cfg.reward.rm_replay_frac == 0.1 and cfg.reward.model_refresh_every == 3
