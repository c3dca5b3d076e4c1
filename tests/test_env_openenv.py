"""OpenEnv environments train in rlvr (rlvr.environments.openenv_env): the arithmetic task as
an OpenEnv environment (examples/openenv_arithmetic.py: a problem per seed, two tries) served
by a real server process on 127.0.0.1. Each rollout is an episode on a WebSocket session of
its own; its reward is the episode's return; the trained ids are the ids the endpoint sampled.
"""

from __future__ import annotations

import inspect
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

pytest.importorskip("openenv")
pytest.importorskip("openai")

import rlvr
from rlvr.config import load_config
from rlvr.config.schema import ConfigError
from rlvr.data.prompts import Prompt
from rlvr.environments.openenv_env import OpenEnv, accepts, adapt
from rlvr.environments.runner import AgentRunner
from rlvr.models import build_tokenizer, eos_ids, load_model
from rlvr.rewards.scoring import Scores
from rlvr.rollout import SamplingParams, build_engine
from rlvr.tasks import TASKS
from rlvr.training.collect import _groups
from rlvr.training.settings import CollectSettings

pytestmark = pytest.mark.environments

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "openenv_arithmetic.py"
TASK = TASKS["arithmetic"]
SMALL = {"rollout.prompts_per_step": 4, "rollout.group_size": 4, "train.eval_size": 8}
NO_TASK = {"reward.accuracy": "none", "algo.max_gen_batches": 1}
READY_S = 60.0  # the server's start: importing openenv (fastapi, gradio) takes ~4 s here


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """The example environment's server process; its URL once /health answers."""
    port, log = _free_port(), tmp_path_factory.mktemp("openenv") / "server.log"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), *sys.path])}
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, str(EXAMPLE), "--port", str(port)], stdout=out, stderr=out, env=env
        )
    url = f"http://127.0.0.1:{port}"
    try:
        end = time.monotonic() + READY_S
        while True:
            try:
                urllib.request.urlopen(url + "/health", timeout=1).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > end:
                    pytest.fail(f"the OpenEnv server did not start: {log.read_text()[-2000:]}")
                time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def _cfg(*overrides):
    return load_config(None, list(overrides))


def _runner(fn, model, tokenizer, timeout=60.0):
    cfg = _cfg("--rollout.max_new_tokens=24")
    return AgentRunner(
        fn,
        build_engine(cfg, model, tokenizer),
        tokenizer,
        params=CollectSettings.from_config(cfg).params,
        eos_ids=eos_ids(tokenizer, model),
        max_tokens=24,
        context=512,
        timeout=timeout,
        on_error="raise",
        task=None,
        system_prompt=None,
        template="{question}",
        name="rlvr-tiny",
    )


def _prompts(rows, tokenizer):
    out = []
    for row in rows:
        ids = tokenizer(row["prompt"], add_special_tokens=False)["input_ids"]
        columns = {k: v for k, v in row.items() if k != "prompt"}
        out.append(Prompt(text=row["prompt"], ids=ids, answer=None, example=None, columns=columns))
    return out


class Recording:
    """The agent's client, keeping the endpoint's replies (their prompt and sampled ids)."""

    def __init__(self, client, replies):
        self.client, self.replies = client, replies
        self.chat = self.completions = self

    async def create(self, **kw):
        reply = await self.client.chat.completions.create(**kw)
        self.replies.append(reply)
        return reply


def test_episodes_score_their_own_problem_and_train_on_the_sampled_ids(server):
    adapted = adapt(server, _cfg())
    assert adapted.kind == "openenv" and adapted.eval_rows is None
    assert adapted.train_rows[3] == {"seed": 3, "prompt": 'OpenEnv episode {"seed": 3}'}
    by_seed: dict[int, list] = {}

    async def agent(client, row):
        by_seed[row["seed"]] = []
        return await adapted.agent(Recording(client, by_seed[row["seed"]]), row)

    tokenizer, model = build_tokenizer(), load_model("rlvr-tiny")
    rows = adapted.train_rows[:8]
    runner = _runner(agent, model, tokenizer)
    try:  # 8 episodes at once, each on its own session of the server
        batch = runner.run(
            _prompts(rows, tokenizer), SamplingParams(n=1, max_new_tokens=24, seed=3), 0
        )
    finally:
        runner.close()
    rollout = batch.rollout
    assert not batch.dropped.any()
    turns = []
    for i, row in enumerate(rows):
        (example,) = TASK.make_examples("train", 1, seed=row["seed"])
        replies = by_seed[row["seed"]]
        texts = [r.choices[0].message.content for r in replies]
        right = [TASK.verify(t, example) for t in texts]
        # the episode's return: 1 for the try that is right (it ends the episode), else 0;
        # two tries at most, so a first wrong answer is followed by a second
        assert float(batch.rewards[i]) == float(any(right)), (texts, example)
        assert len(replies) == (1 if right[0] else 2)
        turns.append(len(replies))
        # the trained completion: the first turn's sampled ids, the context the environment's
        # feedback adds, the second turn's sampled ids (the same check as the agent runner's)
        n = int(rollout.lengths[i])
        got = rollout.completion_ids[i, :n].tolist()
        first = replies[0].choices[0].token_ids
        assert rollout.prompt_ids[i] == replies[0].prompt_token_ids
        assert got[: len(first)] == first
        if len(replies) == 2:
            second = replies[1]
            assert second.prompt_token_ids[: len(replies[0].prompt_token_ids) + len(first)] == (
                replies[0].prompt_token_ids + first
            )
            assert got[len(first) :] == (
                second.prompt_token_ids[len(replies[0].prompt_token_ids) + len(first) :]
                + second.choices[0].token_ids
            )
    assert set(turns) <= {1, 2}
    # what the trainer trains: each Sample's ids are the rollout's
    scores = Scores(batch.rewards, batch.rewards > 0, terms={}, failures={})
    samples = [s for g in _groups(_prompts(rows, tokenizer), rollout, scores, 1) for s in g]
    for i, sample in enumerate(samples):
        assert (
            sample.completion_ids == rollout.completion_ids[i, : int(rollout.lengths[i])].tolist()
        )


def test_a_short_run_on_the_server_reaches_the_metrics(server, tmp_path):
    adapted = adapt(server, _cfg())
    returns: list[float] = []

    async def agent(client, row):
        returns.append(await adapted.agent(client, row))
        return returns[-1]

    result = rlvr.train(
        "rlvr-tiny",
        # rows of no built-in task: no verifier of rlvr's grades them; the episodes' returns
        # are the accuracy term of the reward (reward/accuracy)
        config={**SMALL, **NO_TASK, "train.max_steps": 2, "rollout.max_new_tokens": 16},
        agent=agent,
        train_dataset=adapted.train_rows,
        output_dir=tmp_path / "run",
        show_progress=False,
    )
    adapted.close()
    rows = [json.loads(x) for x in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and set(returns) <= {0.0, 1.0}
    assert len(returns) == sum(row["responses"] for row in rows)
    for row in rows:
        assert row["env/dropped"] == 0 and 1 <= row["env/turns_per_rollout"] <= 2
    # every episode's return is in the step's mean (sums of 0s and 1s over 16 responses: exact)
    assert sum(row["reward/accuracy"] * row["responses"] for row in rows) == sum(returns)


def test_an_app_is_served_on_loopback_and_a_full_server_is_waited_for(tmp_path):
    """The server's app handed over (what `module:app` names): rlvr serves it on a free
    loopback port; with one session at a time, the 2 episodes take turns, and close stops it."""
    sys.path.insert(0, str(EXAMPLE.parent))
    try:
        import openenv_arithmetic as ex
    finally:
        sys.path.remove(str(EXAMPLE.parent))
    from openenv.core.env_server import create_app

    app = create_app(ex.ArithmeticEnvironment, ex.ArithmeticAction, ex.ArithmeticObservation)
    assert accepts(app) and accepts(OpenEnv(app)) and not accepts("http://127.0.0.1:1")
    spec = OpenEnv(app, episodes=[{"seed": 11}, {"seed": 12}], max_turns=1)
    adapted = adapt(spec, _cfg())
    url = adapted.agent.server
    try:
        assert url.startswith("http://127.0.0.1:")
        assert [r["seed"] for r in adapted.train_rows] == [11, 12]
        tokenizer, model = build_tokenizer(), load_model("rlvr-tiny")
        runner = _runner(adapted.agent, model, tokenizer)
        try:
            params = SamplingParams(n=1, max_new_tokens=8, seed=0)
            batch = runner.run(_prompts(adapted.train_rows, tokenizer), params, 0)
        finally:
            runner.close()
        assert not batch.dropped.any() and batch.sums["env/turns"] == 2  # max_turns=1 each
    finally:
        adapted.close()
    with pytest.raises(OSError):
        urllib.request.urlopen(url + "/health", timeout=2)


def test_a_client_names_its_server(server):
    from openenv.core import GenericEnvClient

    client = GenericEnvClient(base_url=server.replace("http://", "ws://"))
    for obj in (client, client.sync(), OpenEnv(client, episodes=3)):
        assert accepts(obj)
        adapted = adapt(obj, _cfg())
        # episodes by default: the default run's 100 steps x 16 prompts (more than 1024)
        episodes = 3 if isinstance(obj, OpenEnv) else 1600
        assert adapted.agent.server == server and len(adapted.train_rows) == episodes


def test_targets_that_are_not_servers_are_one_line_errors_naming_them():
    port = _free_port()  # nothing listens there
    with pytest.raises(ConfigError, match=rf"OpenEnv server http://127.0.0.1:{port}: GET /health"):
        adapt(f"http://127.0.0.1:{port}", _cfg("--env.timeout=1"))
    with pytest.raises(ConfigError, match="cannot import module 'no_such_env_module'"):
        adapt("no_such_env_module:app", _cfg())
    with pytest.raises(ConfigError, match="expected a server URL"):
        adapt(f"{EXAMPLE}:TRIES", _cfg())


@pytest.mark.skipif(
    "environment" not in inspect.signature(rlvr.train).parameters,
    reason="rlvr.train(environment=...) is wired by the env.environment key",
)
def test_train_takes_the_environment_and_the_cli_its_url(server, tmp_path):
    from rlvr.cli.main import main

    result = rlvr.train(
        "rlvr-tiny",
        config={**SMALL, "train.max_steps": 1, "rollout.max_new_tokens": 16},
        environment=OpenEnv(server, episodes=64),
        output_dir=tmp_path / "api",
        show_progress=False,
    )
    (row,) = [json.loads(x) for x in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert row["env/dropped"] == 0 and "accuracy" in row
    argv = ["train", "--env", f"openenv:{server}", "--max-steps", "1", "--no-progress"]
    argv += [f"--{k}={v}" for k, v in SMALL.items()] + ["--rollout.max_new_tokens=16"]
    assert main([*argv, "--output-dir", str(tmp_path / "cli")]) == 0


def test_text_becomes_the_action_and_observations_text():
    from rlvr.environments.openenv_env import default_action, default_observation, http_url

    one = {"properties": {"metadata": {"type": "object"}, "message": {"type": "string"}}}
    assert default_action(one)("<answer>3</answer>", one) == {"message": "<answer>3</answer>"}
    two = {"properties": {"tool_name": {"type": "string"}, "arguments": {"type": "object"}}}
    act = default_action(two)
    assert act('{"tool_name": "add", "arguments": {"a": 1}}', two) == {
        "tool_name": "add",
        "arguments": {"a": 1},
    }
    for text in ("add 1", "[1]"):
        with pytest.raises(
            ValueError, match=r"JSON object with the fields \['arguments', 'tool_name'\]"
        ):
            act(text, two)
    assert default_observation({"prompt": "Compute 1+2.", "metadata": {"k": 1}}) == "Compute 1+2."
    assert default_observation({"board": [1, 2], "turn": "x"}) == '{"board": [1, 2], "turn": "x"}'
    assert http_url("ws://127.0.0.1:8001/") == "http://127.0.0.1:8001"
    assert http_url("wss://a.hf.space") == "https://a.hf.space"


def test_an_action_the_server_refuses_is_the_next_observation(server):
    """A reply that is no valid action: the model reads the error, reward 0, the session
    goes on (the server's VALIDATION_ERROR keeps it open)."""
    import asyncio

    from rlvr.environments.openenv_env import Episodes

    spec = OpenEnv(server, action=lambda text, schema: {"answer": text})  # no such field
    episodes = Episodes(spec, {}, timeout=30.0)

    async def episode():
        env, first = await episodes._reset({"seed": 5}, time.monotonic() + 30)
        try:
            refused = await episodes._step(env, "<answer>1</answer>")
            (example,) = TASK.make_examples("train", 1, seed=5)
            right = await env.step({"message": f"<answer>{example.answer}</answer>"})
        finally:
            await env.close()
        return first, refused, right

    first, refused, right = asyncio.run(episode())
    assert first.observation["prompt"].startswith("Compute ") and not first.done
    assert refused.observation["error"].startswith("invalid action: ") and refused.reward == 0
    assert "VALIDATION_ERROR" in refused.observation["error"] and not refused.done
    assert right.reward == 1.0 and right.done


def test_episodes_are_dicts_of_reset_arguments():
    from rlvr.environments.openenv_env import train_rows

    cfg = _cfg()
    rows = train_rows(OpenEnv("http://x", episodes=[{"seed": 4, "level": "easy"}]), cfg)
    assert rows == [
        {"seed": 4, "level": "easy", "prompt": 'OpenEnv episode {"seed": 4, "level": "easy"}'}
    ]
    for bad in (0, [{"prompt": "hi"}], ["seed"]):
        with pytest.raises(ConfigError, match=r"env\.environment: openenv: episode"):
            train_rows(OpenEnv("http://x", episodes=bad), cfg)
