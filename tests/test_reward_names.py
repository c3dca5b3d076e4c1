"""Which reward is "accuracy" (by name, never by place), what dynamic sampling filters on
without one (the rewards' spread), TRL's `rewards/<name>/mean`, and the advice a run gives once
when it trains on nothing for several steps."""

import random

import pytest

import rlvr
from rlvr.api.inputs import pick_accuracy, reward_changes, says_correct
from rlvr.config.schema import ConfigError
from rlvr.run.health import ADVICE_AFTER, HealthGuard


@pytest.mark.parametrize(
    ("name", "says"),
    [("accuracy_reward", True), ("correctness_reward_func", True), ("exact_match", True),
     ("rewards:math_verify", True), ("code", True), ("format_reward", False),
     ("reward_len", False), ("xmlcount_reward_func", False), ("incorrectly_named", False)],
)  # fmt: skip
def test_a_name_says_correctness_by_its_words(name, says):
    assert says_correct(name) is says


def format_reward(completions, **kwargs):
    return [float("<answer>" in c) for c in completions]


def correctness_reward(completions, answer, **kwargs):
    return [float(a in c) for c, a in zip(completions, answer)]


def reward_len(completions, **kwargs):
    return [-abs(12 - len(c)) / 12 for c in completions]


def test_the_accuracy_reward_is_picked_by_name_not_place():
    changes, _, note = reward_changes([format_reward, correctness_reward], [0.5, 2.0])
    assert changes["accuracy"].endswith("correctness_reward") and changes["accuracy_weight"] == 2.0
    assert [e.rsplit(":", 1)[-1] for e in changes["extra"]] == ["format_reward=0.5"]
    assert note.startswith("note: reward.accuracy: 'correctness_reward', by its name")
    assert "\n" not in note
    # named by the user: no note; "none": every reward is a term of the total
    changes, _, note = reward_changes([format_reward, correctness_reward], None, "format_reward")
    assert changes["accuracy"].endswith("format_reward") and note is None
    changes, _, note = reward_changes([correctness_reward], None, "none")
    assert changes["accuracy"] == "none" and len(changes["extra"]) == 1 and note is None
    changes, _, note = reward_changes(reward_len, None)
    assert changes["accuracy"] == "none" and "none of reward_len is named" in note
    with pytest.raises(ConfigError, match=r"reward.accuracy: 'math' is none of reward_funcs"):
        reward_changes([reward_len], None, "math")


def test_several_names_say_correct_the_first_is_named_in_the_note():
    index, note = pick_accuracy(["exact_match", "m:accuracy_reward"], None)
    assert index == 0 and "(the first of exact_match, accuracy_reward)" in note


def test_advice_once_after_steps_with_nothing_to_train_on():
    guard = HealthGuard(max_bad_steps=3, entropy_floor=0.0)
    failed = {"groups/kept": 0, "groups/all_wrong_frac": 1.0, "groups/all_correct_frac": 0.0}
    said = [guard.check(s, dict(failed), None) for s in range(1, 2 * ADVICE_AFTER + 1)]
    assert said[0] == ["step 1: no update, nothing to train on: every group failed (no "
                       "response correct: no advantage to learn from)"]  # fmt: skip
    advice = [m for ms in said for m in ms if "in a row" in m]
    assert len(advice) == 1 and advice[0].startswith(f"step {ADVICE_AFTER}: no update in 3")
    assert "reward.accuracy=none" in advice[0] and "algo.dynamic_sampling=false" in advice[0]
    equal = {"groups/kept": 0, "groups/equal_reward_frac": 1.0}
    metrics = dict(equal)
    assert (
        "every group's G rewards were equal"
        in HealthGuard(max_bad_steps=3, entropy_floor=0.0).check(1, metrics, None)[0]
    )
    assert metrics["update/skip_reason"] == "all_equal"


def test_trls_length_reward_trains_at_every_step_under_the_default_preset(tmp_path, capsys):
    """TRL's documented continuous reward, ported by changing the trainer call (args as
    GRPOConfig names, rlvr's default preset with dynamic sampling): no response is ever
    correct, so the groups are kept by the spread of their rewards."""
    rng = random.Random(0)
    rows = [{"prompt": f"Compute {rng.randint(10, 99)}+{rng.randint(10, 99)}."}
            for _ in range(200)]  # fmt: skip
    args = {"learning_rate": 4e-4, "num_generations": 4, "per_device_train_batch_size": 16,
            "max_completion_length": 32, "max_steps": 12}  # fmt: skip
    result = rlvr.Trainer(model="rlvr-tiny", reward_funcs=reward_len, args=args,
                          train_dataset=rows, config={"train.eval_size": 0},
                          output_dir=tmp_path / "run", show_progress=False).train()  # fmt: skip
    assert "none of reward_len is named for correctness" in capsys.readouterr().err
    m = result.metrics
    assert [r["update/skipped"] for r in m] == [0.0] * 12
    assert all(r["groups/kept"] == 4 and "accuracy" not in r for r in m)
    # the total is the reward plus the preset's soft overlong punishment: float32 sums of 16
    # values in [-4, 0] in another order, a few ulps (2.4e-7 each) apart
    assert all(r["rewards/reward_len/mean"] + r["reward/soft_overlong"]
               == pytest.approx(r["reward/mean"], abs=1e-5) for r in m)  # fmt: skip
    first, last = (sum(r["reward/mean"] for r in rs) / 5 for rs in (m[:5], m[-5:]))
    assert last > first, (first, last)
