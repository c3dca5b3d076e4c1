"""What a run says: steps that train on nothing and why, reward failures, a solved task told
apart from a collapsing policy, and sample completions in TensorBoard and tracker tables."""

from __future__ import annotations

import io
import re
import sys
import textwrap

import pytest
from rich.console import Console

from rlvr.run.health import HealthGuard, skip_reason
from rlvr.run.metrics import RunLogger, samples_markdown


def _guard() -> HealthGuard:
    return HealthGuard(max_bad_steps=3, entropy_floor=0.05)


def test_low_entropy_at_low_accuracy_is_a_collapse():
    m = {"entropy": 0.01, "accuracy": 0.3, "groups/identical_frac": 0.95}
    msgs = _guard().check(1, m, None)
    assert m["warn/entropy_collapse"] == 1.0 and m["warn/identical_groups"] == 1.0
    assert m["info/solved"] == 0.0
    assert any("collapsing" in t and "accuracy 0.30" in t for t in msgs)


def test_low_entropy_at_99_percent_is_a_solved_task_not_a_collapse():
    guard = _guard()
    m = {"entropy": 0.004, "accuracy": 0.99, "groups/identical_frac": 0.97}
    msgs = guard.check(5, m, None)
    assert m["warn/entropy_collapse"] == 0.0 and m["warn/identical_groups"] == 0.0
    assert m["info/solved"] == 1.0
    assert msgs == ["step 5: accuracy 0.99 with low entropy or identical groups: the task is "
                    "(nearly) solved, which is not a collapse"]  # fmt: skip
    assert guard.check(6, dict(m), None) == []  # said once


def test_skip_reasons():
    base = {"groups/kept": 0, "groups/all_correct_frac": 0.0, "groups/all_wrong_frac": 0.0}
    assert skip_reason({**base, "groups/all_correct_frac": 1.0}) == "all_solved"
    assert skip_reason({**base, "groups/all_wrong_frac": 1.0}) == "all_failed"
    mixed = {**base, "groups/all_correct_frac": 0.75, "groups/all_wrong_frac": 0.25}
    assert skip_reason(mixed) == "all_filtered"
    assert skip_reason({"groups/kept": 4, "loss_tokens": 0.0}) == "all_truncated"
    assert skip_reason({"groups/kept": 4, "loss_tokens": 120.0, "entropy": 0.5}) is None


def test_a_step_that_trains_on_nothing_says_why_in_metrics_and_on_screen():
    guard = _guard()
    m = {"groups/kept": 0, "groups/all_correct_frac": 0.75, "groups/all_wrong_frac": 0.25,
         "accuracy": 0.75}  # fmt: skip
    msgs = guard.check(3, m, None)
    assert m["update/skipped"] == 1.0 and m["update/skip_reason"] == "all_filtered"
    assert msgs == ["step 3: no update, nothing to train on: dynamic sampling filtered every "
                    "group (75% of responses in all-correct groups, 25% in all-wrong ones)"]  # fmt: skip
    assert guard.check(4, dict(m), None) == []  # the same reason is said once
    trained = {"groups/kept": 2, "loss_tokens": 50.0, "entropy": 1.0, "accuracy": 0.5}
    guard.check(5, trained, None)
    assert trained["update/skipped"] == 0.0 and "update/skip_reason" not in trained
    assert guard.check(6, dict(m), None) != []  # and again after steps that trained


def test_reward_failures_are_announced_and_totalled(tmp_path):
    guard = _guard()
    m = {"failures/accuracy": 44.0, "failures/format": 0.0, "responses": 64}
    assert guard.check(1, m, None) == [
        "step 1: reward 'accuracy' failed on 44 of 64 responses, scored 0 (reward.on_error=zero)"
    ]
    out = io.StringIO()
    console = Console(file=out, width=200)
    with RunLogger(tmp_path, total_steps=2, console=console, show_progress=False) as log:
        log.log(1, {**m, "accuracy": 0.5})
        log.log(2, {"failures/accuracy": 6.0, "responses": 64})
    text = out.getvalue()
    assert "'accuracy' 50 of 128 responses" in text and "format" not in text


def test_progress_line_says_no_update_instead_of_zero_entropy(tmp_path):
    with RunLogger(tmp_path, total_steps=1, show_progress=False, tensorboard=False) as log:
        log.log(1, {"accuracy": 1.0, "update/skip_reason": "all_solved"})
        info = log.progress.tasks[0].fields["info"]
    assert "no update (all_solved)" in info and "ent" not in info


ROWS = [
    {"prompt": "Compute 1+2.", "completion": "<answer>3</answer>", "answer": "3", "reward": 1.0,
     "correct": True, "length": 18},
    {"prompt": "Compute 2+2.", "completion": "a | b\nc", "answer": "4", "reward": -1.0,
     "correct": False, "length": 7},
]  # fmt: skip


def test_samples_go_to_tensorboard_text(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    with RunLogger(tmp_path, total_steps=1, show_progress=False) as log:
        log.samples(3, ROWS)
    acc = EventAccumulator(str(tmp_path / "tensorboard"), size_guidance={"tensors": 0})
    acc.Reload()
    events = acc.Tensors("samples/text_summary")
    assert [e.step for e in events] == [3]
    text = events[0].tensor_proto.string_val[0].decode()
    assert text == samples_markdown(ROWS)
    from tensorboard.plugin_util import markdown_to_safe_html

    html = markdown_to_safe_html(text)  # what TensorBoard's text tab shows
    assert "<td>&lt;answer&gt;3&lt;/answer&gt;</td>" in html  # tags shown, not swallowed
    assert "<td>a | b<br>c</td>" in html  # one table row per sample, whatever it holds


def test_samples_go_to_a_tracker_table(tmp_path, monkeypatch):
    # a tracker module with wandb's API (init, log, finish, Table), importable by name
    (tmp_path / "fake_tracker.py").write_text(
        textwrap.dedent(
            """
            LOGGED = []
            class Table:
                def __init__(self, columns, data):
                    self.columns, self.data = columns, data
            def init(**kwargs):
                pass
            def log(values, step):
                LOGGED.append((step, values))
            def finish():
                pass
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    with RunLogger(run_dir, total_steps=1, show_progress=False, tensorboard=False,
                   report_to=("fake_tracker",)) as log:  # fmt: skip
        log.samples(2, ROWS)
    logged = sys.modules["fake_tracker"].LOGGED
    step, values = logged[-1]
    table = values["samples"]
    assert step == 2 and table.columns[:4] == ["prompt", "completion", "answer", "reward"]
    assert table.data[0][:4] == ["Compute 1+2.", "<answer>3</answer>", "3", 1.0]


@pytest.mark.parametrize("show_progress", [True, False])
def test_a_plain_line_every_log_every_steps_without_a_terminal(tmp_path, show_progress):
    out = io.StringIO()  # a pipe, a file, CI: not a terminal, so rich draws no live bar
    console = Console(file=out, soft_wrap=True)
    with RunLogger(tmp_path, total_steps=12, console=console, show_progress=show_progress,
                   log_every=5, tensorboard=False) as log:  # fmt: skip
        for step in range(1, 13):
            log.log(step, {"reward/mean": 0.25, "accuracy": 0.5, "entropy": 0.75,
                           "tokens_per_s": 100.0})  # fmt: skip
    lines = [x for x in out.getvalue().splitlines() if x.startswith("step ")]
    assert [x.split()[1] for x in lines] == ["5/12", "10/12", "12/12"]
    assert "reward +0.250  acc 0.500  ent 0.750  tok/s 100" in lines[0]


def test_no_plain_lines_under_a_live_bar_or_with_log_every_0(tmp_path):
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, soft_wrap=True)
    with RunLogger(tmp_path, total_steps=4, console=console, log_every=1, tensorboard=False) as log:
        for step in range(1, 5):
            log.log(step, {"accuracy": 0.5})
    assert not re.search(r"^step \d+/4  ", out.getvalue(), re.M)
    quiet = io.StringIO()
    with RunLogger(tmp_path, total_steps=4, console=Console(file=quiet), log_every=0,
                   tensorboard=False) as log:  # fmt: skip
        log.log(4, {"accuracy": 0.5})
    assert "step 4/4" not in quiet.getvalue()
