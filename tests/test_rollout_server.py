"""The rollout server (rlvr.rollout.server, docs/async.md): the engine in its own process.

Engine level: the server's rollouts are the in-process fast engine's (the same tokens), with tools
and with LoRA weights merged in; weights reach it only when not pinned. Run level (`python -m
rlvr train` subprocesses, marked slow): a run through the server trains what the in-process run
does, with generation of step s+1 starting before step s's update ends at staleness 1 and not
at staleness 0; `rlvr eval` works through it; bad keys get one line."""

import itertools
import json
import os
import subprocess
import sys

import pytest
import torch

from rlvr.config.load import load_config
from rlvr.config.placement import parse_cpus
from rlvr.config.schema import Config, ConfigError
from rlvr.models import eos_ids
from rlvr.rollout import FastEngine, SamplingParams
from rlvr.rollout.base import EngineSite
from rlvr.rollout.server import ServerEngine
from rlvr.tasks import TASKS
from rlvr.tools import Toolbox
from same_run import Tolerance, assert_same_run
from test_resume import _args, _math, _run

ONE_CPU = str(min(os.sched_getaffinity(0)))


def _server_cfg(**server) -> Config:
    return load_config(None, {"rollout": {"server.enabled": "true", **{f"server.{k}": v for k, v in server.items()}}})  # fmt: skip


def _prompts(tokenizer, task="arithmetic", n=4):
    t = TASKS[task]
    return [
        tokenizer.apply_chat_template(t.prompt_messages(ex), add_generation_prompt=True,
                                      tokenize=True, return_dict=False)
        for ex in t.make_examples("test", n, seed=1)
    ]  # fmt: skip


def _same(a, b):
    """The same tokens; the log-probs equal to float rounding (the server computes with its own
    copy of the weights: measured differences up to 1e-6 on a token's log-prob)."""
    assert torch.equal(a.completion_ids, b.completion_ids)
    assert torch.equal(a.lengths, b.lengths)
    torch.testing.assert_close(a.sampling_log_probs, b.sampling_log_probs, atol=1e-5, rtol=0)


def _engines(model, tokenizer, tools=None):
    pad, eos = tokenizer.pad_token_id, eos_ids(tokenizer, model)
    site = EngineSite(tools=tools)
    here = FastEngine.from_config(model, pad_id=pad, eos_ids=eos, cfg=Config(), site=site)
    there = ServerEngine.from_config(model, pad_id=pad, eos_ids=eos, cfg=_server_cfg(), site=site)
    return here, there


@pytest.mark.compares_runs
def test_the_server_samples_what_the_engine_samples_in_process(tiny_model, tokenizer, one_thread):
    here, there = _engines(tiny_model, tokenizer)
    try:
        params = SamplingParams(n=3, max_new_tokens=12, seed=7)
        prompts = _prompts(tokenizer)
        _same(here.generate(prompts, params), there.generate(prompts, params))
        # an update while pinned: the server keeps the weights it had; after, it has the new
        before = there.generate(prompts, params)
        with there.pinned():
            with torch.no_grad():
                for p in tiny_model.parameters():
                    p.add_(torch.randn_like(p) * 0.05)
            there.sync_weights()
            _same(before, there.generate(prompts, params))
        after = there.generate(prompts, params)
        assert not torch.equal(after.sampling_log_probs, before.sampling_log_probs)
        _same(here.generate(prompts, params), after)
    finally:
        there.close()
    assert there.proc.returncode == 0  # it exits when its socket closes
    there.close()  # a second close finds it ended
    assert there.proc.returncode == 0


def test_tools_run_in_the_server(tiny_model, tokenizer, one_thread):
    tools = Toolbox(["calc"], tokenizer, max_calls=2, max_total_tokens=64)
    here, there = _engines(tiny_model, tokenizer, tools)
    try:
        params = SamplingParams(n=2, max_new_tokens=48, seed=3)
        prompts = _prompts(tokenizer, "calc")
        a, b = here.generate(prompts, params), there.generate(prompts, params)
        _same(a, b)
        assert torch.equal(a.tool_mask, b.tool_mask)
    finally:
        there.close()


def test_lora_reaches_the_server_merged(tiny_model, tokenizer, one_thread):
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(tiny_model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))  # fmt: skip
    here, there = _engines(model, tokenizer)
    try:
        with torch.no_grad():  # B = 0 at init: give the adapter an effect
            for n, p in model.named_parameters():
                if "lora_B" in n:
                    p.normal_(0, 0.5)
        there.sync_weights()
        params = SamplingParams(n=2, max_new_tokens=12, seed=5)
        prompts = _prompts(tokenizer)
        _same(here.generate(prompts, params), there.generate(prompts, params))
    finally:
        there.close()


def test_a_dead_server_is_named(tiny_model, tokenizer):
    from rlvr.rollout.server import ServerError

    _, there = _engines(tiny_model, tokenizer)
    there.proc.kill()
    with pytest.raises(ServerError, match=r"rollout server \(pid \d+\) was killed by signal 9"):
        there.generate(_prompts(tokenizer), SamplingParams(n=1, max_new_tokens=4))


@pytest.mark.parametrize(
    ("text", "words"),
    [("x", "expected CPUs like 0 or 0-3,8"), ("99999", "expected CPUs among"), ("", "expected CPUs among")],
)  # fmt: skip
def test_bad_cpu_lists_name_the_key(text, words):
    with pytest.raises(ConfigError, match=f"rollout.server.cpus: got '{text}', {words}"):
        parse_cpus("rollout.server.cpus", text)


def test_refusals_name_the_key(tiny_model, tokenizer):
    pad, eos = tokenizer.pad_token_id, [tokenizer.eos_token_id]
    with pytest.raises(ConfigError, match=r"rollout\.server: rollout\.engine=hf reports no"):
        load_config(None, {"rollout": {"server.enabled": "true", "engine": "hf"}})  # at load
    ranks = EngineSite(world_size=2)
    with pytest.raises(ConfigError, match=r"rollout\.server: one trainer process only"):
        ServerEngine.from_config(tiny_model, pad_id=pad, eos_ids=eos, cfg=_server_cfg(), site=ranks)


def _server_args(model_dir, run, k, *extra, steps=6):
    return [
        *_args(model_dir, run, steps), f"--train.max_staleness={k}", "--algo.rollout_correction=token",
        "--rollout.server.enabled=true", *extra,
    ]  # fmt: skip


def _rows(run):
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]


SERVER_ROUNDING = Tolerance(
    rel=1e-5,
    abs=1e-6,
    why="the server's engine computes the log-probs the importance weights and the loss use "
    "in another process, over its own batch: the same values to a few fp32 ulps",
)


def _same_math(a, b):
    """The same samples (rewards, lengths, accuracy, kept groups: exact); what the engine's
    log-probs enter (the importance weights, the loss) equal to float rounding."""
    assert_same_run(a, b, default=SERVER_ROUNDING)


@pytest.mark.compares_runs
@pytest.mark.slow
@pytest.mark.parametrize("k", [1, 2])
def test_a_run_through_the_server_is_the_run_in_process(tiny_model_dir, tmp_path, k):
    """At k = 1 against the in-process run; at k = 2 the schedule and the overlap."""
    here, there = tmp_path / "here", tmp_path / "there"
    args = [*_args(tiny_model_dir, here, 4), f"--train.max_staleness={k}", "--algo.rollout_correction=token"]  # fmt: skip
    for a in ([args] if k == 1 else []) + [_server_args(tiny_model_dir, there, k, steps=4)]:
        res = _run(a)
        assert res.returncode == 0, res.stderr
    if k == 1:
        _same_math(_math(here), _math(there))
    rows = _rows(there)
    assert [r["staleness/max"] for r in rows] == [min(t - 1, k) for t in range(1, 5)]
    # the last batch ahead (step s+k, s+1 at k = 1) is generated beside step s's update
    for s, ahead in zip(rows, rows[k:]):
        assert ahead["time/gen_start"] < s["time/update_end"]
    assert all(r["time/gen_wait"] >= 0 and r["time/train_wait"] >= 0 for r in rows[:-k])


@pytest.mark.slow
def test_staleness_0_through_the_server_generates_then_trains(tiny_model_dir, tmp_path):
    run = tmp_path / "sync"
    res = _run(_server_args(tiny_model_dir, run, 0, steps=3))
    assert res.returncode == 0, res.stderr
    rows = _rows(run)
    for s, nxt in itertools.pairwise(rows):
        assert s["time/update_end"] <= nxt["time/gen_start"]
    assert all("time/gen_wait" not in r for r in rows)


@pytest.mark.slow
def test_eval_goes_through_the_server():
    outs = []
    for extra in ([], ["--rollout.server.enabled=true"]):
        res = subprocess.run(
            [sys.executable, "-m", "rlvr", "eval", "--model", "rlvr-tiny", "--k", "2", "--num-prompts", "8", *extra],
            capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert res.returncode == 0, res.stderr
        outs.append(res.stdout)
    assert outs[0] == outs[1]


@pytest.mark.slow
def test_trainer_cpus_pin_the_trainer(tiny_model_dir, tmp_path):
    run = tmp_path / "run"
    res = _run(_server_args(tiny_model_dir, run, 1, f"--rollout.server.cpus={ONE_CPU}",
                            f"--rollout.server.trainer_cpus={ONE_CPU}", steps=2))  # fmt: skip
    assert res.returncode == 0, res.stderr
    summary = json.loads((run / "summary.json").read_text())
    assert summary["rollout_server"] and summary["trainer_cpus"] == [int(ONE_CPU)]
    res = _run(_server_args(tiny_model_dir, run.with_name("bad"), 1, "--rollout.server.cpus=0-99999"))  # fmt: skip
    assert res.returncode == 2
    assert res.stderr.strip().splitlines()[-1].startswith("error: rollout.server.cpus: got '0-99999'")  # fmt: skip


def test_cpu_lists_without_the_server_are_refused():
    from rlvr.config.validate import validate

    for key in ("cpus", "trainer_cpus", "device"):
        with pytest.raises(ConfigError, match=rf"rollout\.server\.{key}: got '0', but rollout\.server\.enabled is false"):  # fmt: skip
            validate(load_config(None, {"rollout": {f"server.{key}": "0"}}))


def test_no_room_for_the_weights_is_one_error_not_a_sigbus():
    from rlvr.rollout.server import ServerError, _reserve

    with pytest.raises(
        ServerError, match=r"no room for the \d+ MiB of shared weights .*set TMPDIR"
    ):
        _reserve(2**62)  # more than any file system here holds


def test_a_missing_device_is_named():
    from rlvr.config.validate import validate

    asked = {"server.enabled": "true", "server.device": "cuda:7"}
    with pytest.raises(ConfigError, match=r"rollout\.server\.device: 'cuda:7' asked for, but this machine has \d+ CUDA"):  # fmt: skip
        validate(load_config(None, {"rollout": asked}))
    with pytest.raises(ConfigError, match=r"rollout\.server\.device: got 'gpu', expected a torch device"):  # fmt: skip
        validate(load_config(None, {"rollout": {**asked, "server.device": "gpu"}}))
