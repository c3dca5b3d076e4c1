"""Rollouts with tool calls on a scripted real tiny model (tests/tool_script.py): two tool
turns in one row while another row ends without a tool, the tool turns' mask, the rounds of
the hf engine against a turn-by-turn `generate`, and the fast engine against both."""

from dataclasses import replace

import pytest
import torch

from rlvr.models import build_tokenizer
from rlvr.rollout import HFEngine, SamplingParams
from rlvr.tools import Toolbox
from tool_script import script, scripted_model


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Decoding a tiny model is dominated by per-step overheads: one thread is faster, and
    far faster on a busy machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def setup(one_thread):
    tok = build_tokenizer()
    box = Toolbox(["calc"], tok)
    return tok, box, scripted_model(tok, box), script(tok, box)


def _greedy(n=1, max_new=256):
    return SamplingParams(n=n, max_new_tokens=max_new, greedy=True)


def test_two_tool_turns_in_one_row_while_another_ends_without(setup):
    tok, box, model, ((a, a_done), (b, b_done)) = setup
    engine = HFEngine(model, pad_id=tok.pad_token_id, eos_ids=[tok.eos_token_id], tools=box)
    r = engine.generate([a, b], _greedy(n=2))
    assert r.completion_ids[0, : r.lengths[0]].tolist() == a_done
    assert r.completion_ids[2, : r.lengths[2]].tolist() == b_done
    assert r.tool_calls.tolist() == [2, 2, 0, 0] and r.tool_errors.tolist() == [0, 0, 0, 0]
    assert not r.truncated.any()
    # the tool mask covers exactly the two tool turns
    reply1, reply2 = box.reply_ids("408"), box.reply_ids("413")
    text = tok.decode(r.completion_ids[0, : r.lengths[0]][r.tool_mask[0, : r.lengths[0]]])
    assert text == tok.decode(reply1 + reply2)
    assert int(r.tool_mask[0].sum()) == len(reply1) + len(reply2)
    assert not r.tool_mask[2:].any()
    assert (
        r.model_lengths.tolist()
        == [len(a_done) - len(reply1) - len(reply2)] * 2 + [len(b_done)] * 2
    )
    assert r.response_mask[0].sum() == r.model_lengths[0]


def test_budgets_and_call_limit(setup):
    tok, box, model, ((a, a_done), _) = setup
    pad, eos = tok.pad_token_id, [tok.eos_token_id]
    first_call = a_done.index(box.close_ids[0]) + 1
    reply = box.reply_ids("408")
    # the total budget ends inside the first tool turn: cut there, truncated
    cut = Toolbox(["calc"], tok, max_total_tokens=first_call + 5)
    r = HFEngine(model, pad_id=pad, eos_ids=eos, tools=cut).generate([a], _greedy())
    assert r.lengths.tolist() == [first_call + 5] and r.truncated.tolist() == [True]
    assert r.completion_ids[0].tolist() == a_done[: first_call + 5]
    assert r.tool_calls.tolist() == [1] and int(r.tool_mask.sum()) == 5
    # max_new_tokens counts the model's tokens only when the total budget is larger
    big = Toolbox(["calc"], tok, max_total_tokens=400)
    r = HFEngine(model, pad_id=pad, eos_ids=eos, tools=big).generate(
        [a], _greedy(max_new=first_call + 3)
    )
    assert r.lengths.tolist() == [first_call + len(reply) + 3] and r.truncated.tolist() == [True]
    assert int(r.tool_mask.sum()) == len(reply)
    # no calls left: the close tag is plain text, the row decodes on without a tool turn
    none = Toolbox(["calc"], tok, max_calls=0)
    r = HFEngine(model, pad_id=pad, eos_ids=eos, tools=none).generate([a], _greedy(max_new=60))
    assert r.tool_calls.tolist() == [0] and not r.tool_mask.any()
    assert r.completion_ids[0, :first_call].tolist() == a_done[:first_call]


def _turn_by_turn(model, tok, box, prompt, max_new):
    """Greedy `generate` one turn at a time on one row: stop at EOS or the close tag, run
    the tool, append its turn, generate again."""
    ids = list(prompt)
    done = []
    for _ in range(box.max_calls + 1):
        out = model.generate(
            input_ids=torch.tensor([ids]),
            attention_mask=torch.ones(1, len(ids), dtype=torch.long),
            max_new_tokens=max_new - len(done),
            do_sample=False,
            eos_token_id=[tok.eos_token_id, *box.close_ids],
            pad_token_id=tok.pad_token_id,
        )[0, len(ids) :].tolist()
        done += out
        ids += out
        if out[-1] != box.close_ids[-1]:
            return done
        reply = box.respond(out).ids
        done += reply
        ids += reply
    return done


def test_hf_rounds_equal_turn_by_turn_generate(setup):
    tok, box, model, ((a, _), (b, _)) = setup
    engine = HFEngine(model, pad_id=tok.pad_token_id, eos_ids=[tok.eos_token_id], tools=box)
    r = engine.generate([a, b], _greedy())
    for i, p in enumerate([a, b]):
        assert r.completion_ids[i, : r.lengths[i]].tolist() == _turn_by_turn(
            model, tok, box, p, 256
        )


@pytest.mark.parametrize("path", ["prefill", "per_step", "backend"])
def test_fast_engine_equals_the_hf_rounds(setup, path):
    """Greedy: the fast engine gives the hf engine's rows token for token, with the same tool
    mask and counts, also when the budgets cut a row inside a tool turn: on the torch path
    (a tool turn as one multi-token prefill of its row, or fed one token a step) and on the
    CPU backend's path where its gate is on."""
    from rlvr import cpu
    from rlvr.rollout import FastEngine

    tok, box, model, ((a, a_done), (b, _)) = setup
    pad, eos = tok.pad_token_id, [tok.eos_token_id]
    kw = {} if path == "backend" else {"backend": cpu.OFF}
    first_call = a_done.index(box.close_ids[0]) + 1
    cases = [
        (box, _greedy(n=2)),
        (Toolbox(["calc"], tok, max_total_tokens=first_call + 5), _greedy()),
        (Toolbox(["calc"], tok, max_total_tokens=400), _greedy(max_new=first_call + 3)),
        (Toolbox(["calc"], tok, max_calls=1), _greedy(max_new=150)),
    ]
    for tools, params in cases:
        want = HFEngine(model, pad_id=pad, eos_ids=eos, tools=tools).generate([a, b, a], params)
        fast = FastEngine(model, pad_id=pad, eos_ids=eos, tools=tools, **kw)
        fast.tool_prefill = path == "prefill"
        got = fast.generate([a, b, a], params)
        assert torch.equal(got.lengths, want.lengths)
        assert torch.equal(got.truncated, want.truncated)
        for i, n in enumerate(want.lengths.tolist()):
            assert got.completion_ids[i, :n].tolist() == want.completion_ids[i, :n].tolist()
            assert torch.equal(got.tool_mask[i, :n], want.tool_mask[i, :n])
        assert torch.equal(got.tool_calls, want.tool_calls)
        assert torch.equal(got.tool_errors, want.tool_errors)
        # the engine's log-probs: 0 on tool tokens, the trainer's on the model's own
        assert not got.sampling_log_probs[got.tool_mask].any()


def test_vllm_rounds_logic_equals_the_hf_rounds(setup):
    """The vllm engine's round logic (`vllm_tools.tool_rounds`), driven here by greedy
    `generate` one request at a time in place of vLLM, gives the hf engine's rows."""
    from rlvr.rollout.vllm_tools import tool_rounds

    tok, box, model, ((a, _), (b, _)) = setup

    def generate(requests):
        out = []
        for r in requests:
            ids = model.generate(
                input_ids=torch.tensor([r.ids]),
                attention_mask=torch.ones(1, len(r.ids), dtype=torch.long),
                max_new_tokens=r.max_tokens,
                do_sample=False,
                eos_token_id=r.stop_ids,
                pad_token_id=tok.pad_token_id,
            )[0, len(r.ids) :].tolist()
            out.append((ids, [0.0] * len(ids)))
        return out

    params = _greedy(max_new=150)
    small = Toolbox(["calc"], tok, max_calls=1)
    for tools in (box, small):
        want = HFEngine(model, pad_id=tok.pad_token_id, eos_ids=[tok.eos_token_id], tools=tools)
        want = want.generate([a, b], params)
        got = tool_rounds(tools, [a, b], [0, 1], params, [tok.eos_token_id], generate, 0)
        assert torch.equal(got.completion_ids, want.completion_ids)
        assert torch.equal(got.tool_mask, want.tool_mask)
        assert torch.equal(got.lengths, want.lengths) and torch.equal(got.truncated, want.truncated)
        assert got.tool_calls.tolist() == want.tool_calls.tolist()


def _sample_until(engine, prompts, params, reached, tries=40):
    """The first rollout, over row seeds tried in turn, for which `reached(rollout)` holds.

    Which seed exercises a case depends on the CPU: the scripted model is trained in the
    fixture, and each kernel set (AVX-512, AVX2, the default) rounds its logits differently,
    so the same seed samples other tokens. Searching keeps the case certain on every machine;
    the test fails only if none of `tries` seeds reaches it."""
    for k in range(tries):
        seeds = tuple(100 * k + i for i in range(len(prompts)))
        rollout = engine.generate(prompts, replace(params, row_seeds=seeds))
        if reached(rollout):
            return rollout
    pytest.fail(f"no row seeds of {tries} tried reached the case the test needs")


@pytest.mark.parametrize("path", ["prefill", "per_step", "backend"])
def test_sampled_log_probs_are_the_trainers(setup, path):
    """Sampled at temperature 1 (rows diverge: broken calls, error turns, calls at other
    places, rows retired mid-way), the engine's log-prob of every model token equals the
    trainer's on the whole row, tool turns as context."""
    from rlvr import cpu
    from rlvr.rollout import FastEngine
    from rlvr.training.batch import rollout_log_probs

    tok, box, model, ((a, _), (b, _)) = setup
    kw = {} if path == "backend" else {"backend": cpu.OFF}
    eos = [tok.eos_token_id]
    # the batch compacted whenever a row ends, between and during other rows' tool turns
    fast = FastEngine(model, pad_id=0, eos_ids=eos, tools=box, retire_fraction=1e-9, **kw)
    fast.tool_prefill = path == "prefill"
    params = SamplingParams(n=6, max_new_tokens=200, seed=3)
    r = _sample_until(
        fast, [a, b], params, lambda r: r.tool_calls.sum() > 3 and r.tool_errors.sum() > 0
    )
    trainer = rollout_log_probs(model, r, tok.pad_token_id)
    own = r.response_mask.bool()
    torch.testing.assert_close(r.sampling_log_probs[own], trainer[own], atol=2e-4, rtol=0)
    # a total budget that rows reach at different steps while the others, and the rows that
    # ended (never compacted away here), stay in the batch
    fast.tools, fast.retire_fraction = Toolbox(["calc"], tok, max_total_tokens=110), None
    r = _sample_until(
        fast,
        [a, b, a],
        replace(params, n=8, max_new_tokens=90),
        lambda r: 0 < r.truncated.sum() < len(r) and (r.lengths == 110).any(),
    )
    trainer = rollout_log_probs(model, r, tok.pad_token_id)
    own = r.response_mask.bool()
    torch.testing.assert_close(r.sampling_log_probs[own], trainer[own], atol=2e-4, rtol=0)
