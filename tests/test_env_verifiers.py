"""`verifiers` 0.4 environments train in rlvr (`env.environment`, `rlvr train --env`,
`rlvr.train(environment=...)`): the built-in arithmetic task written as a `verifiers.v1`
environment (examples/verifiers_arithmetic.py) on the built-in model, its episodes run whole by
`verifiers` (the interception server, the training client rendering ids with `renderers`, the
run's endpoint at `inference/v1/generate`).

The spec and refusal checks and the named reward terms' arithmetic run without `verifiers`; the
rest (marked `environments`) in the venv scripts/environments_env.sh builds."""

import json
import math
import sys
from pathlib import Path

import pytest

import rlvr
from rlvr.cli.main import main
from rlvr.config.schema import ConfigError
from rlvr.environments.recorder import AgentFault
from rlvr.environments.runner import weighted_reward

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "verifiers_arithmetic.py"
SPEC = f"verifiers:{EXAMPLE}:load_environment"
SMALL = ["--rollout.prompts_per_step=4", "--rollout.group_size=4", "--no-progress"]


def _has_verifiers() -> bool:
    try:
        import verifiers.v1  # noqa: F401
    except ImportError:
        return False
    return True


def _error_lines(capsys) -> list[str]:
    return [line for line in capsys.readouterr().err.splitlines() if line.strip()]


@pytest.mark.skipif(_has_verifiers(), reason="the verifiers package is installed")
def test_a_missing_verifiers_package_is_one_line_with_its_install(tmp_path, capsys):
    argv = ["train", "--env", SPEC, "--max-steps", "1", "--output-dir", str(tmp_path / "r")]
    assert main([*argv, *SMALL]) == 2
    assert _error_lines(capsys) == [
        "error: env.environment: verifiers environments need the verifiers package: "
        'pip install "rlvr[verifiers]"'
    ]
    assert not (tmp_path / "r").exists()  # refused before the run directory is written


@pytest.mark.parametrize(
    ("extra", "line"),
    [
        (["--env", "nope:x"], "env.environment: got 'nope:x', expected KIND:TARGET with KIND "
         "one of ['openenv', 'verifiers'] (e.g. verifiers:my_env:load_environment)"),
        (["--env", "verifiers"], "env.environment: got 'verifiers', expected KIND:TARGET"),
        (["--env", SPEC, "--agent", "m:f"], "env.agent: got 'm:f', expected none beside "
         "env.environment (the environment drives the rollouts)"),
        (["--env", SPEC, "--data.path=rows.jsonl"], "data.path: got 'rows.jsonl', expected "
         "none beside env.environment (the environment gives the prompts)"),
    ],
)  # fmt: skip
def test_a_bad_environment_is_one_line_before_any_work(extra, line, tmp_path, capsys):
    assert main(["train", *extra, "--output-dir", str(tmp_path / "r"), *SMALL]) == 2
    lines = _error_lines(capsys)
    assert len(lines) == 1 and lines[0].startswith(f"error: {line}"), lines
    assert not (tmp_path / "r").exists()


def test_the_api_refuses_an_environment_beside_an_agent_or_a_dataset(tmp_path):
    with pytest.raises(ConfigError, match=r"^environment: not with agent= "):
        rlvr.Trainer(environment=SPEC, agent=lambda client, row: 1.0)
    with pytest.raises(ConfigError, match=r"^environment: not with train_dataset= "):
        rlvr.Trainer(environment=SPEC, train_dataset=[{"prompt": "q", "answer": "a"}])


def test_an_object_of_no_known_kind_is_refused_by_name(tmp_path):
    with pytest.raises(ConfigError, match=r"^environment: expected a `verifiers.v1` Env"):
        rlvr.train(environment=object(), config={"train.max_steps": 1},
                   output_dir=tmp_path / "r", show_progress=False)  # fmt: skip
    assert not (tmp_path / "r").exists()


def test_named_terms_add_up_with_their_weights():
    weights = {"correct": 1.0, "style": 0.5, "logged": 0.0}
    # hand-computed: 1*(-1) + 0.5*0.6 + 0*7 = -0.7
    total, terms = weighted_reward({"correct": -1, "style": 0.6, "logged": 7}, weights)
    assert math.isclose(total, -0.7, abs_tol=1e-12)  # float sums: one rounding each
    assert terms == {"correct": -1.0, "style": 0.6, "logged": 7.0}
    # a plain loop over the same values
    loop = 0.0
    for name, w in weights.items():
        loop += w * terms[name]
    assert total == loop
    assert weighted_reward(0.25, None) == (0.25, {})


@pytest.mark.parametrize(
    ("value", "kind"),
    [
        ({"correct": 1.0}, "missing_term"),
        ({"correct": 1.0, "style": float("nan")}, "non_finite"),
        ({"correct": 1.0, "style": "1"}, "non_numeric"),
        ({"correct": 1.0, "style": 0.0, "other": 1.0}, "unknown_term"),
        (1.0, "non_numeric"),
    ],
)
def test_a_missing_or_bad_term_is_a_fault(value, kind):
    with pytest.raises(AgentFault) as e:
        weighted_reward(value, {"correct": 1.0, "style": 0.5})
    assert e.value.kind == kind


# ---- with verifiers installed (scripts/environments_env.sh) ----------------------------------


def _metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def _example():
    pytest.importorskip("verifiers.v1")
    sys.path.insert(0, str(EXAMPLE.parent))
    import verifiers_arithmetic

    return verifiers_arithmetic


@pytest.mark.environments
def test_cli_run_logs_each_named_term_and_resumes_only_when_named(tmp_path, capsys):
    _example()
    run = tmp_path / "run"
    argv = ["train", "--env", SPEC, "--max-steps", "2", "--output-dir", str(run), *SMALL]
    assert main(argv) == 0
    rows = _metrics(run)
    assert len(rows) == 2
    for row in rows:
        assert row["env/dropped"] == 0 and row["env/turns_per_rollout"] == 1
        # reward/accuracy: the weighted sum the run trains on; answer_tag has weight 0
        assert math.isclose(row["reward/accuracy"], row["reward/correct"], abs_tol=1e-6)
        assert 0.0 <= row["reward/answer_tag"] <= 1.0
        # correct is +-1, so the correct fraction is (mean + 1) / 2 (exact in binary)
        assert math.isclose(row["accuracy"], (row["reward/correct"] + 1) / 2, abs_tol=1e-6)
    assert SPEC.split(":", 1)[1] in (run / "config.yaml").read_text()
    resume = ["train", "--resume", str(run), "--max-steps", "3", "--no-progress"]
    assert main(resume) == 2
    assert "--env ..." in capsys.readouterr().err
    assert main([*resume, "--env", SPEC]) == 0
    assert [r["step"] for r in _metrics(run)] == [1, 2, 3]


@pytest.mark.environments
def test_the_python_api_takes_the_environment_object(tmp_path):
    env = _example().load_environment()
    config = {"rollout.prompts_per_step": 4, "rollout.group_size": 4, "train.max_steps": 1}
    result = rlvr.train("rlvr-tiny", environment=env, config=config,
                        output_dir=tmp_path / "run", show_progress=False)  # fmt: skip
    (row,) = result.metrics
    assert row["env/dropped"] == 0 and {"reward/correct", "reward/answer_tag"} <= set(row)
    assert "environment: null" in (result.run_dir / "config.yaml").read_text()  # not a name


def _runner_batch(turns: int, on_error: str = "raise"):
    """One generation batch of the example environment (3 prompts x 2 responses) through the
    agent runner on the built-in model; the verifiers episodes it ran, recorded."""
    from rlvr.config import load_config
    from rlvr.data.prompts import Prompt
    from rlvr.environments.adapter import adapt
    from rlvr.environments.runner import build_agents
    from rlvr.models import build_tokenizer, load_model
    from rlvr.rollout import SamplingParams, build_engine

    env = _example().load_environment(turns=turns)
    episodes = []
    run_episode = env.run_episode

    async def recording(task, ctx, **kw):
        episode = await run_episode(task, ctx, **kw)
        episodes.append(episode)
        return episode

    env.run_episode = recording  # the third-party object's method, observed
    cfg = load_config(None, ["--rollout.max_new_tokens=16", f"--env.on_error={on_error}"])
    adapted = adapt(cfg, env)
    assert adapted.reward_weights == {"correct": 1.0, "answer_tag": 0.0}
    tokenizer, model = build_tokenizer(), load_model("rlvr-tiny")
    source = type("Source", (), {"task": None})()
    runner = build_agents(cfg, build_engine(cfg, model, tokenizer), tokenizer, model, source,
                          None, adapted)  # fmt: skip
    try:
        prompts = []
        for i, row in enumerate(adapted.train_rows[:3]):
            text = tokenizer.apply_chat_template(row["prompt"], add_generation_prompt=True,
                                                 tokenize=False)  # fmt: skip
            ids = tokenizer(text, add_special_tokens=False)["input_ids"]
            prompts.append(Prompt(text=text, ids=ids, answer=None, example=None,
                                  columns={"vf_task": i}))  # fmt: skip
        batch = runner.run(prompts, SamplingParams(n=2, max_new_tokens=16, seed=3), step=0)
    finally:
        runner.close()
    return batch, episodes


@pytest.mark.environments
def test_trained_ids_are_the_ids_verifiers_sampled():
    """Each trained row is a verifiers trace's token sequence (its prompt as the renderer
    rendered it, its completion as the endpoint sampled it), with the trace's rewards."""
    batch, episodes = _runner_batch(turns=1)
    assert not batch.dropped.any() and len(episodes) == 6
    assert set(batch.terms) == {"correct", "answer_tag"}
    assert batch.rewards.tolist() == batch.terms["correct"].tolist()  # answer_tag: weight 0
    by_ids = {}
    for episode in episodes:
        (trace,) = episode.traces
        (branch,) = trace.branches
        assert trace.num_turns == 1
        by_ids[tuple(branch.token_ids)] = (branch.sampled_mask, trace.rewards)
    rollout = batch.rollout
    for i in range(len(rollout)):
        n = int(rollout.lengths[i])
        prompt = rollout.prompt_ids[i]
        ids = tuple(prompt + rollout.completion_ids[i, :n].tolist())
        assert ids in by_ids, f"row {i} is not a verifiers trace's token sequence"
        mask, rewards = by_ids[ids]
        assert mask == [False] * len(prompt) + [True] * n  # verifiers' sampled tokens: trained
        assert batch.terms["correct"][i].item() == rewards["correct"].score
        assert batch.terms["answer_tag"][i].item() == rewards["answer_tag"].score


@pytest.mark.environments
def test_a_second_turn_the_renderer_renders_again_is_drift_and_not_trained():
    """`renderers`' DefaultRenderer (rlvr-tiny's: no renderer of its own) does not bridge
    turns: it renders the whole conversation again, and the earlier reply's <think> part went
    to reasoning_content, which the template drops, so turn 2's prompt is not turn 1's
    sampled ids. The endpoint refuses such a turn (drift); under on_error=drop it is counted
    and left out, never trained as ids the model did not sample."""
    batch, _ = _runner_batch(turns=2, on_error="drop")
    assert batch.dropped.all() and batch.sums["env/faults/drift"] == 6


@pytest.mark.environments
@pytest.mark.slow
def test_the_arithmetic_environment_trains_the_built_in_model(tmp_path, capsys):
    """The built-in arithmetic task as a verifiers environment, the default run otherwise
    (dapo, rlvr-tiny, 100 steps): held-out accuracy (the built-in run's 128 held-out prompts,
    sampled by `rlvr eval`) up by at least 0.40, as `rlvr train` lifts it (0.398 -> 0.97)."""
    _example()
    run = tmp_path / "run"
    argv = ["train", "--env", SPEC, "--max-steps", "100", "--output-dir", str(run)]
    assert main([*argv, "--no-progress"]) == 0

    def held_out(model: str) -> float:
        capsys.readouterr()
        argv = ["eval", "--model", model, "--task", "arithmetic", "--num-prompts", "128"]
        assert main([*argv, "--k", "1"]) == 0
        return json.loads(capsys.readouterr().out)["avg@1"]

    before, after = held_out("rlvr-tiny"), held_out(str(run))
    assert after >= before + 0.40, (before, after)
