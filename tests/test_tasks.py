"""Built-in tasks: seeded generation, disjoint splits, exact verifiers that never run text."""

from __future__ import annotations

import pytest

from rlvr.tasks import TASKS, Example, Task, extract_answer, format_ok

NAMES = sorted(TASKS)


def test_task_names():
    assert set(TASKS) >= {"arithmetic", "chain", "sort", "calc"}
    for name, task in TASKS.items():
        assert isinstance(task, Task)
        assert task.name == name


@pytest.mark.parametrize("name", NAMES)
def test_generation_is_reproducible(name):
    task = TASKS[name]
    assert task.make_examples("train", 50, seed=3) == task.make_examples("train", 50, seed=3)
    assert task.make_examples("train", 50, seed=3) != task.make_examples("train", 50, seed=4)
    assert task.make_examples("test", 50, seed=3) != task.make_examples("train", 50, seed=3)


@pytest.mark.parametrize("name", NAMES)
def test_splits_are_disjoint(name):
    task = TASKS[name]
    train = {ex.question for ex in task.make_examples("train", 3000, seed=0)}
    test = [ex.question for ex in task.make_examples("test", 500, seed=0)]
    assert len(train) == 3000 and len(set(test)) == 500
    assert train.isdisjoint(test)
    assert all(task.split_of(Example(q, "")) == "test" for q in test)


@pytest.mark.parametrize("name", NAMES)
def test_bad_split_and_too_many(name):
    with pytest.raises(ValueError, match="split"):
        TASKS[name].make_examples("validation", 5, seed=0)


def test_small_space_reports_shortfall():
    with pytest.raises(ValueError, match="distinct"):
        TASKS["arithmetic"].make_examples("test", 10**6, seed=0)


@pytest.mark.parametrize("name", NAMES)
def test_reference_completions_verify_and_prompts_name_the_format(name):
    task = TASKS[name]
    for ex in task.make_examples("test", 200, seed=0):
        assert task.verify(task.reference_completion(ex), ex)
        assert task.verify(task.reference_completion(ex) + "<|im_end|>", ex)
        messages = task.prompt_messages(ex)
        assert messages[-1]["role"] == "user"
        assert ex.question in messages[-1]["content"]
        assert "<answer></answer>" in messages[-1]["content"]


def hostile(ex: Example) -> list[str]:
    return [
        "",
        ex.answer,  # right value but no tags
        f"<answer>{ex.answer}",
        f"{ex.answer}</answer>",
        f"</answer>{ex.answer}<answer>",
        f"<answer>{ex.answer}</answer><answer>{ex.answer}</answer>",
        f"<answer>0</answer><answer>{ex.answer}</answer>",  # hedging over guesses
        f"<answer>{ex.answer} </answer>x" + "9" * 100,  # trailing junk after the block is fine
        "<answer>__import__('os').system('echo pwned')</answer>",
        f"<answer>{ex.question}</answer>",  # the expression, not its value
        "<answer>" + "1" * 1_000_000 + "</answer>",
        "<think>" * 100_000,
        "\x00<answer>\udcff</answer>",
    ]


@pytest.mark.parametrize("name", NAMES)
def test_verify_rejects_wrong_malformed_and_hostile(name):
    task = TASKS[name]
    for ex in task.make_examples("test", 20, seed=0):
        results = [task.verify(c, ex) for c in hostile(ex)]
        expression_is_answer = ex.question == ex.answer  # an already sorted `sort` question
        assert results == [False] * 7 + [True, False, expression_is_answer] + [False] * 3
        near_miss = ex.answer[:-1] + ("0" if ex.answer[-1] != "0" else "1")
        assert not task.verify(f"<answer>{near_miss}</answer>", ex)


def test_arithmetic_answers():
    task = TASKS["arithmetic"]
    ex = Example("85-47", "38", {"a": 85, "b": 47, "op": "-"})
    assert task.reference_completion(ex) == "<think>15-7=8\n7-4=3</think><answer>38</answer>"
    assert task.verify("<answer>38</answer>", ex)
    assert task.verify("<think></think><answer> 38\n</answer>", ex)
    assert not task.verify("<answer>038</answer>", ex)
    assert not task.verify("<answer>-38</answer>", ex)
    assert not task.verify("<answer>38.0</answer>", ex)
    ex = Example("47+85", "132", {"a": 47, "b": 85, "op": "+"})
    assert task.reference_completion(ex) == "<think>7+5=12\n4+8+1=13</think><answer>132</answer>"
    for ex in task.make_examples("train", 500, seed=0):
        a, op, b = ex.meta["a"], ex.meta["op"], ex.meta["b"]
        assert ex.question == f"{a}{op}{b}"
        assert int(ex.answer) == (a + b if op == "+" else a - b) >= 0


def test_chain_completion_shows_running_sums():
    task = TASKS["chain"]
    ex = Example(
        "7+5-3+8", "17", {"terms": (7, 5, 3, 8), "ops": ("+", "-", "+"), "partials": (7, 12, 9, 17)}
    )
    completion = task.reference_completion(ex)
    assert completion == "<think>7+5=12\n12-3=9\n9+8=17</think><answer>17</answer>"
    assert format_ok(completion) and task.verify(completion, ex)
    for ex in task.make_examples("train", 300, seed=0):
        assert int(ex.answer) == sum(
            t if op == "+" else -t for op, t in zip(("+", *ex.meta["ops"]), ex.meta["terms"])
        )


def test_chain_lengths_vary_past_a_modest_cap():
    from rlvr.models import build_tokenizer

    tokenizer = build_tokenizer()
    task = TASKS["chain"]
    lengths = [
        len(tokenizer(task.reference_completion(ex), add_special_tokens=False)["input_ids"]) + 1
        for ex in task.make_examples("test", 500, seed=0)
    ]
    assert max(lengths) <= task.max_new_tokens
    assert min(lengths) < 24 and sum(n > 40 for n in lengths) > 10


def test_calc_reference_conversation():
    from rlvr.models import build_tokenizer

    task = TASKS["calc"]
    assert task.tools == ("calc",) and TASKS["arithmetic"].tools == ()
    ex = Example("347*28+519", "10235", {"a": 347, "b": 28, "c": 519, "op": "+"})
    assert task.instruction(ex) == (
        "Compute 347*28+519. Use the calc tool. Answer in <answer></answer>."
    )
    call = '<tool_call>{"name": "calc", "arguments": {"expression": "%s"}}</tool_call>'
    assert task.reference_messages(ex) == [
        {"role": "assistant", "content": call % "347*28"},
        {"role": "tool", "content": "9716"},
        {"role": "assistant", "content": call % "9716+519"},
        {"role": "tool", "content": "10235"},
        {"role": "assistant", "content": "<answer>10235</answer>"},
    ]
    # the completion is the chat template's rendering of those turns after the prompt
    tokenizer = build_tokenizer()
    lengths = []
    for ex in task.make_examples("test", 300, seed=0):
        prompt = tokenizer.apply_chat_template(
            task.prompt_messages(ex), add_generation_prompt=True, tokenize=False
        )
        full = tokenizer.apply_chat_template(
            [*task.prompt_messages(ex), *task.reference_messages(ex)], tokenize=False
        )
        completion = task.reference_completion(ex)
        assert full == prompt + completion + "<|im_end|>\n"
        lengths.append(len(tokenizer(completion, add_special_tokens=False)["input_ids"]) + 1)
        m = ex.meta
        assert ex.question == f"{m['a']}*{m['b']}{m['op']}{m['c']}"
        assert 100 <= m["a"] <= 999 and 10 <= m["b"] <= 99 and 100 <= m["c"] <= 999
        assert int(ex.answer) == m["a"] * m["b"] + (m["c"] if m["op"] == "+" else -m["c"]) > 0
        # the answer is not readable from the first tool result alone
        assert not task.verify(f"<answer>{m['a'] * m['b']}</answer>", ex)
    assert max(lengths) <= task.max_new_tokens


def test_sort_answers():
    task = TASKS["sort"]
    ex = Example("52918", "12589")
    assert task.verify("<answer>12589</answer>", ex)
    assert not task.verify("<answer>1 2 5 8 9</answer>", ex)
    assert not task.verify("<answer>98521</answer>", ex)


def test_extract_answer_and_format_ok():
    assert extract_answer("<think>x</think><answer> 5 </answer>") == "5"
    assert extract_answer("<answer></answer>") == ""
    assert extract_answer("no tags") is None
    assert format_ok("<think>a</think>\n<answer>1</answer>")
    assert format_ok("  <think></think><answer></answer>\n")
    assert not format_ok("<answer>1</answer>")
    assert not format_ok("<think>a</think>b<answer>1</answer>")
    assert not format_ok("<think>a</think><answer>1</answer>extra")
    assert not format_ok("<answer>1</answer><think>a</think>")
    assert not format_ok("<think><think>a</think><answer>1</answer>")
    assert not format_ok("<think>a</think><answer>1</answer><answer>2</answer>")
    assert not format_ok("<think>" * 100_000)
