"""The run's OpenAI-compatible endpoint and the agent runner on real parts: the built-in model
on the fast engine, a real HTTP server on 127.0.0.1, the `openai` client.

Token in, token out: the built-in tokenizer is extended with two-digit tokens ("00".."99"), so
the model's digits sampled one by one decode to a text that re-encodes to other ids; the
trajectory holds the sampled ids, turn after turn, with the context between turns masked."""

import time

import pytest
import torch

pytest.importorskip("openai")

import agent_funcs
from rlvr.config import load_config
from rlvr.config.schema import ConfigError
from rlvr.data.prompts import render_messages
from rlvr.environments.runner import AgentError, AgentRunner
from rlvr.models import build_tokenizer, eos_ids, load_model
from rlvr.rewards.scoring import Scores
from rlvr.rollout import SamplingParams, build_engine
from rlvr.tasks import TASKS
from rlvr.training.collect import _groups
from rlvr.training.settings import CollectSettings

DIGIT_PAIRS = [f"{a}{b}" for a in range(10) for b in range(10)]


@pytest.fixture(scope="module")
def merging():
    """rlvr-tiny with two-digit tokens added: encode("132") is ["13", "2"], never the
    model's "1", "3", "2"."""
    tokenizer = build_tokenizer()
    tokenizer.add_tokens(DIGIT_PAIRS)
    model = load_model("rlvr-tiny")
    model.resize_token_embeddings(len(tokenizer))
    return model, tokenizer


def _runner(model, tokenizer, fn, **env):
    engine = env.get("engine", "fast")
    cfg = load_config(None, ["--rollout.max_new_tokens=24", f"--rollout.engine={engine}"])
    return AgentRunner(
        fn,
        build_engine(cfg, model, tokenizer),
        tokenizer,
        params=CollectSettings.from_config(cfg).params,
        eos_ids=eos_ids(tokenizer, model),
        max_tokens=24,
        context=env.get("context", 512),
        timeout=env.get("timeout", 60.0),
        on_error=env.get("on_error", "raise"),
        task=TASKS["arithmetic"],
        system_prompt=None,
        template="{question}",
        name="rlvr-tiny",
    )


def _prompts(tokenizer, n):
    from rlvr.data.prompts import Prompt

    task = TASKS["arithmetic"]
    out = []
    for ex in task.make_examples("train", n, seed=0):
        text, ids = render_messages(task.prompt_messages(ex), tokenizer)
        out.append(Prompt(text=text, ids=ids, answer=ex.answer, example=ex))
    return out


def _params(n):
    return SamplingParams(n=n, max_new_tokens=24, seed=7)


def test_two_turns_train_on_the_sampled_ids(merging):
    model, tokenizer = merging
    replies: dict[str, list] = {}

    def agent(client, row):
        messages = list(row["messages"])
        first = client.chat.completions.create(model="m", messages=messages)
        messages += [
            {"role": "assistant", "content": first.choices[0].message.content},
            {"role": "user", "content": "Check it."},
        ]
        second = client.chat.completions.create(model="m", messages=messages, max_tokens=12)
        replies[row["prompt"] + str(id(messages))] = [first, second]
        return 1.0

    runner = _runner(model, tokenizer, agent)
    try:
        prompts = _prompts(tokenizer, 4)
        batch = runner.run(prompts, _params(2), step=0)
    finally:
        runner.close()
    rollout = batch.rollout
    assert not batch.dropped.any() and len(replies) == 8
    by_prompt = {}
    for first, second in replies.values():
        by_prompt.setdefault(tuple(first.prompt_token_ids), []).append((first, second))
    drifted = 0
    for i in range(len(rollout)):
        n = int(rollout.lengths[i])
        row = rollout.completion_ids[i, :n].tolist()
        pairs = by_prompt[tuple(rollout.prompt_ids[i])]
        match = [
            (f, s)
            for f, s in pairs
            if row
            == f.choices[0].token_ids
            + s.prompt_token_ids[len(f.prompt_token_ids) + len(f.choices[0].token_ids) :]
            + s.choices[0].token_ids
        ]
        assert match, f"row {i} is not its turns' sampled ids and the context between them"
        f, s = match[0]
        sampled1, sampled2 = f.choices[0].token_ids, s.choices[0].token_ids
        # turn 2's prompt extends turn 1's prompt and sampled ids exactly
        assert s.prompt_token_ids[: len(f.prompt_token_ids) + len(sampled1)] == (
            f.prompt_token_ids + sampled1
        )
        context = rollout.tool_mask[i, :n].tolist()
        assert context == [False] * len(sampled1) + [True] * (n - len(sampled1) - len(sampled2)) + [
            False
        ] * len(sampled2)
        text = tokenizer.decode(sampled1, skip_special_tokens=False)
        drifted += tokenizer(text, add_special_tokens=False)["input_ids"] != sampled1
        # the sampled log-probs of the model's tokens come through; 0 on the context
        lps = rollout.sampling_log_probs[i, :n]
        assert (lps[torch.tensor(context)] == 0).all() and (lps[~torch.tensor(context)] < 0).any()
    assert drifted > 0, "no sampled completion re-encodes to other ids: the check proves nothing"
    # what the trainer trains: each Sample's ids are the rollout's, the sampled ones
    scores = Scores(batch.rewards, batch.rewards > 0, terms={}, failures={})
    rows = [p for p in prompts for _ in range(2)]
    samples = [s for g in _groups(rows, rollout, scores, 2) for s in g]
    for i, sample in enumerate(samples):
        n = int(rollout.lengths[i])
        assert sample.completion_ids == rollout.completion_ids[i, :n].tolist()
        assert sample.prompt_ids == rollout.prompt_ids[i]


def test_a_prompt_that_does_not_extend_the_last_turn_is_drift(merging):
    model, tokenizer = merging

    def rewrites_its_history(client, row):
        messages = list(row["messages"])
        first = client.chat.completions.create(model="m", messages=messages, max_tokens=4)
        messages += [{"role": "assistant", "content": "x" + first.choices[0].message.content}]
        client.chat.completions.create(model="m", messages=messages, max_tokens=4)
        return 1.0

    runner = _runner(model, tokenizer, rewrites_its_history, on_error="drop")
    try:
        batch = runner.run(_prompts(tokenizer, 2), _params(1), step=0)
        assert batch.dropped.all() and batch.sums["env/faults/drift"] == 2
    finally:
        runner.close()


def test_the_hf_engine_serves_without_sampling_log_probs(merging):
    model, tokenizer = merging
    got = []

    def agent(client, row):
        reply = client.chat.completions.create(model="m", messages=row["messages"])
        got.append(reply.choices[0].token_ids)
        return 1.0

    runner = _runner(model, tokenizer, agent, engine="hf")
    try:
        batch = runner.run(_prompts(tokenizer, 2), _params(2), step=0)
    finally:
        runner.close()
    rollout = batch.rollout
    assert rollout.sampling_log_probs is None  # the trainer's forward computes them
    rows = [rollout.completion_ids[i, : rollout.lengths[i]].tolist() for i in range(4)]
    assert sorted(rows) == sorted(got)


def test_a_prompt_that_fills_the_context_is_a_fault(merging):
    model, tokenizer = merging
    prompts = _prompts(tokenizer, 2)
    runner = _runner(
        model, tokenizer, agent_funcs.arithmetic, on_error="drop", context=len(prompts[0].ids)
    )
    try:
        batch = runner.run(prompts, _params(1), step=0)
        assert batch.sums["env/faults/context"] == 2
    finally:
        runner.close()


def test_completions_take_token_ids(merging):
    model, tokenizer = merging
    got = []

    def ids_in(client, row):
        ids = tokenizer(row["prompt"], add_special_tokens=False)["input_ids"]
        reply = client.completions.create(model="m", prompt=ids, max_tokens=5)
        got.append((ids, reply.prompt_token_ids, reply.choices[0].token_ids))
        return 0.5

    runner = _runner(model, tokenizer, ids_in)
    try:
        batch = runner.run(_prompts(tokenizer, 2), _params(1), step=0)
    finally:
        runner.close()
    assert batch.rewards.tolist() == [0.5, 0.5]
    for ids, prompt_ids, sampled in got:
        assert ids == prompt_ids and 1 <= len(sampled) <= 5
    assert sorted(tuple(p) for p in batch.rollout.prompt_ids) == sorted(tuple(g[0]) for g in got)


FAULTS = [
    (agent_funcs.raises, "raised"),
    (agent_funcs.nan, "non_finite"),
    (agent_funcs.text_reward, "non_numeric"),
    (agent_funcs.no_completion, "no_completion"),
    (agent_funcs.hangs, "timeout"),
    (agent_funcs.hangs_async, "timeout"),
]


@pytest.mark.parametrize(("fn", "kind"), FAULTS, ids=[f.__name__ for f, _ in FAULTS])
def test_faults_end_or_drop_within_the_timeout(merging, fn, kind):
    model, tokenizer = merging
    timeout = 2.0
    for on_error in ("drop", "raise"):
        runner = _runner(model, tokenizer, fn, timeout=timeout, on_error=on_error)
        t0 = time.monotonic()
        try:
            if on_error == "drop":
                batch = runner.run(_prompts(tokenizer, 2), _params(2), step=0)
                assert batch.dropped.all() and batch.sums[f"env/faults/{kind}"] == 4
                assert batch.sums["env/dropped"] == 4 and (batch.rollout.lengths == 0).all()
            else:
                with pytest.raises(AgentError, match=rf"row 0 .*\[{kind}\]"):
                    runner.run(_prompts(tokenizer, 2), _params(2), step=0)
        finally:
            runner.close()
        assert time.monotonic() - t0 < timeout + 30  # env.timeout + 30 s, as docs promise


def test_tools_beside_an_agent_are_refused(tmp_path):
    import rlvr

    with pytest.raises(ConfigError, match=r"rollout\.tools: calc would not run"):
        rlvr.train(
            "rlvr-tiny",
            agent=agent_funcs.arithmetic,
            tools=["calc"],
            output_dir=tmp_path / "run",
            show_progress=False,
        )


def test_env_keys_are_checked():
    with pytest.raises(ConfigError, match=r"env\.timeout"):
        load_config(None, ["--env.timeout=0"])
    with pytest.raises(ConfigError, match=r"env\.agent"):
        load_config(None, ["--env.agent=no_colon"])
    with pytest.raises(ConfigError, match=r"env\.on_error"):
        load_config(None, ["--env.on_error=zero"])
