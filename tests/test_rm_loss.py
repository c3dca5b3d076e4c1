"""The reward model's losses by hand on a tiny batch, AUC against a plain loop, replay's
fraction, group batches, and the records' files."""

import math
import random

import pytest
import torch

from rlvr.rm.fit import group_batches, response_mask
from rlvr.rm.iterative import renumber, replay_sample
from rlvr.rm.loss import (
    bce_loss,
    bradley_terry_loss,
    pair_mask,
    prefix_values,
    rm_loss,
    token_bce_loss,
)
from rlvr.rm.metrics import agreement, auc, rm_metrics
from rlvr.rm.records import Record, read_records, write_records


def _sig(x):
    return 1 / (1 + math.exp(-x))


def test_bce_by_hand():
    logits, labels = torch.tensor([2.0, -1.0, 0.5]), torch.tensor([1.0, 0.0, 0.0])
    by_hand = -(math.log(_sig(2.0)) + math.log(1 - _sig(-1.0)) + math.log(1 - _sig(0.5))) / 3
    assert bce_loss(logits, labels).item() == pytest.approx(by_hand, rel=1e-6)


def test_bradley_terry_by_hand_pairs_only_within_a_group():
    # group 0: a (correct, 2.0), b (wrong, 0.5), c (wrong, -1.0); group 1: d (correct, 0.0),
    # e (correct, 1.0): no wrong answer, no pair; group 2: f (wrong, 3.0) alone
    logits = torch.tensor([2.0, 0.5, -1.0, 0.0, 1.0, 3.0])
    labels = torch.tensor([1, 0, 0, 1, 1, 0])
    groups = torch.tensor([0, 0, 0, 1, 1, 2])
    pairs = [(2.0, 0.5), (2.0, -1.0)]  # (a, b), (a, c): nothing across groups
    by_hand = sum(-math.log(_sig(win - lose)) for win, lose in pairs) / len(pairs)
    assert bradley_terry_loss(logits, labels, groups).item() == pytest.approx(by_hand, rel=1e-6)
    assert int(pair_mask(labels, groups).sum()) == 2
    assert bradley_terry_loss(logits[3:5], labels[3:5], groups[3:5]) is None  # no pair
    assert rm_loss("bt", logits, labels, groups).item() == pytest.approx(by_hand, rel=1e-6)
    with pytest.raises(ValueError, match="bce, token_bce, prefix_bce or bt"):
        rm_loss("hinge", logits, labels, groups)


def test_token_bce_by_hand_weighs_each_response_equally():
    # row 0 (correct): response tokens at 1..2; row 1 (wrong): response tokens 2..4 of 5
    logits = torch.tensor([[9.0, 1.0, -2.0, 0.0, 0.0], [9.0, 9.0, 0.5, 1.5, -1.0]])
    attention = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])
    mask = response_mask(attention, [1, 2])
    assert mask.tolist() == [[False, True, True, False, False], [False, False, True, True, True]]
    row0 = -(math.log(_sig(1.0)) + math.log(_sig(-2.0))) / 2
    row1 = -(math.log(1 - _sig(0.5)) + math.log(1 - _sig(1.5)) + math.log(1 - _sig(-1.0))) / 3
    got = token_bce_loss(logits, torch.tensor([1.0, 0.0]), mask)
    assert got.item() == pytest.approx((row0 + row1) / 2, rel=1e-6)
    # a response of one token is the last-token bce
    one = response_mask(torch.tensor([[1, 1, 1]]), [2])
    x = torch.tensor([[5.0, 5.0, 0.7]])
    assert token_bce_loss(x, torch.tensor([0.0]), one).item() == pytest.approx(
        bce_loss(torch.tensor([0.7]), torch.tensor([0.0])).item(), rel=1e-6
    )


def test_prefix_values_by_hand():
    # group 0: three responses share token 5; two continue with 6 (one right, one wrong),
    # one with 7 (right). Group 1 repeats the wrong response's tokens: never pooled with 0.
    responses = [[5, 6, 1], [5, 6, 2], [5, 7], [5, 6, 2]]
    labels, groups = [True, False, True, False], [0, 0, 0, 1]
    got = prefix_values(responses, labels, groups)
    assert got == [[2 / 3, 1 / 2, 1.0], [2 / 3, 1 / 2, 0.0], [2 / 3, 1.0], [0.0, 0.0, 0.0]]
    # identical responses share every prefix; a response's last value is its label when
    # no other response equals it
    assert prefix_values([[1, 2], [1, 2]], [True, True], [3, 3]) == [[1.0, 1.0], [1.0, 1.0]]


def test_token_bce_takes_per_token_targets():
    logits = torch.tensor([[0.3, -0.4, 2.0]])
    mask = torch.tensor([[False, True, True]])
    targets = torch.tensor([[0.0, 0.5, 1.0]])
    by_hand = -(0.5 * math.log(_sig(-0.4)) + 0.5 * math.log(1 - _sig(-0.4)) + math.log(_sig(2.0)))
    assert token_bce_loss(logits, targets, mask).item() == pytest.approx(by_hand / 2, rel=1e-6)


def test_losses_have_the_hand_gradient():
    logits = torch.tensor([1.0, -0.5], requires_grad=True)
    bradley_terry_loss(logits, torch.tensor([1, 0]), torch.tensor([0, 0])).backward()
    g = _sig(1.0 - -0.5) - 1  # d/dr_w of -log sigmoid(r_w - r_l)
    torch.testing.assert_close(logits.grad, torch.tensor([g, -g]))


def _auc_loop(scores, labels):
    pos = [s for s, y in zip(scores, labels) if y]
    neg = [s for s, y in zip(scores, labels) if not y]
    wins = sum(1.0 if p > n else 0.5 if p == n else 0.0 for p in pos for n in neg)
    return wins / (len(pos) * len(neg))


def test_auc_equals_the_pairwise_loop_with_ties():
    rng = random.Random(0)
    for _ in range(20):
        n = rng.randint(2, 30)
        scores = [float(rng.randint(0, 5)) for _ in range(n)]  # many ties
        labels = [rng.random() < 0.4 for _ in range(n)]
        got = auc(torch.tensor(scores), torch.tensor(labels))
        if all(labels) or not any(labels):
            assert got is None
        else:
            assert got == pytest.approx(_auc_loop(scores, labels), abs=1e-12)
    assert auc(torch.tensor([3.0, 1.0]), torch.tensor([True, False])) == 1.0


def test_metrics_split_the_well_formed():
    logits = torch.tensor([2.0, -1.0, 1.0, -3.0])
    labels = torch.tensor([True, False, False, True])
    wf = torch.tensor([True, True, False, False])
    m = rm_metrics(logits, labels, wf)
    assert m["accuracy"] == 0.5 and agreement(logits, labels) == 0.5
    assert m["auc"] == _auc_loop(logits.tolist(), labels.tolist())
    assert m["auc_well_formed"] == 1.0 and m["well_formed"] == 2


def _records(n, groups):
    return [Record(f"p{i % groups}", f"r{i}", i % 3 == 0, True, i % groups) for i in range(n)]


@pytest.mark.parametrize("frac", [0.0, 0.1, 0.25, 1.0])
def test_replay_draws_the_stated_fraction_of_distinct_history(frac):
    history = _records(517, 50)
    got = replay_sample(history, frac, seed=3)
    assert len(got) == round(frac * 517)
    assert len({r.response for r in got}) == len(got)  # without replacement
    assert set(got) <= set(history)
    assert got == replay_sample(history, frac, seed=3)  # a function of the seed
    if 0 < frac < 1:
        assert got != replay_sample(history, frac, seed=4)


def test_renumbered_sources_never_share_a_group():
    a, b = renumber(_records(6, 2), 0), renumber(_records(6, 2), 1)
    assert {r.group for r in a}.isdisjoint({r.group for r in b})
    assert len({r.group for r in a}) == 2


def test_group_batches_keep_groups_whole_and_depend_on_seed_and_epoch():
    recs = _records(40, 10)
    batches = group_batches(recs, 3, seed=0, epoch=0)
    assert sorted(i for b in batches for i in b) == list(range(40))
    for b in batches:
        groups = {recs[i].group for i in b}
        assert all(
            sum(r.group == g for r in recs) == sum(recs[i].group == g for i in b) for g in groups
        )
    assert batches == group_batches(recs, 3, seed=0, epoch=0)
    assert batches != group_batches(recs, 3, seed=0, epoch=1)


def test_records_round_trip_and_a_bad_line_is_named(tmp_path):
    recs = _records(5, 2)
    write_records(tmp_path / "d.jsonl", recs)
    assert read_records(tmp_path / "d.jsonl") == recs
    (tmp_path / "bad.jsonl").write_text('{"prompt": "x"}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:1: not a response record"):
        read_records(tmp_path / "bad.jsonl")
