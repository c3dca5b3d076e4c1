"""scripts/build_tiny_model.py's label smoothing: the loss by hand and against a plain loop, and
the per-task ``eps`` that samples a whole reference target with the chosen probability."""

import importlib.util
import math
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from rlvr.models import build_tokenizer
from rlvr.tasks import TASKS

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


@pytest.fixture(scope="module")
def build():
    sys.path.insert(0, str(SCRIPTS))  # the script imports its data module by name
    try:
        spec = importlib.util.spec_from_file_location(
            "build_tiny_model", SCRIPTS / "build_tiny_model.py"
        )
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # dataclasses look their module up while defining
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.path.remove(str(SCRIPTS))
        sys.modules.pop("build_tiny_model", None)


def test_smoothed_loss_by_hand(build):
    # one labelled position, vocab 2, p = (0.25, 0.75), label 1, eps 0.2:
    # nll = -ln 0.75 = 0.2876821, uniform = -(ln 0.25 + ln 0.75) / 2 = 0.8369882
    # loss = 0.8 * 0.2876821 + 0.2 * 0.8369882 = 0.3975433
    logits = torch.tensor([[[0.0, math.log(3.0)], [0.0, 0.0]]])  # position 0 predicts label 1
    labels = torch.tensor([[-100, 1]])
    out = build.smoothed_loss(logits, labels, torch.tensor([[False, True]]), 0.2, None)
    assert out.item() == pytest.approx(0.3975433, abs=1e-6)
    # not smoothed there: plain cross-entropy
    plain = build.smoothed_loss(logits, labels, torch.tensor([[False, False]]), 0.2, None)
    assert plain.item() == pytest.approx(-math.log(0.75), abs=1e-6)


def _loop(logits, labels, smoothed, eps, smooth_ids):
    terms = []
    for b in range(labels.shape[0]):
        for t in range(1, labels.shape[1]):
            y = int(labels[b, t])
            if y == -100:
                continue
            logp = F.log_softmax(logits[b, t - 1].double(), -1)
            support = range(len(logp)) if smooth_ids is None else smooth_ids.tolist()
            uniform = -sum(logp[i] for i in support) / len(support)
            w = eps if smoothed[b, t] else 0.0
            terms.append((1 - w) * -logp[y] + w * uniform)
    return sum(terms) / len(terms)


@pytest.mark.parametrize("digits", [False, True])
def test_smoothed_loss_matches_a_plain_loop(build, digits):
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 6, 12, generator=g)
    labels = torch.randint(0, 12, (3, 6), generator=g)
    labels[0, 3:] = -100
    labels[2, :2] = -100
    smoothed = torch.rand(3, 6, generator=g) > 0.4
    smooth_ids = torch.tensor([2, 5, 7]) if digits else None
    got = build.smoothed_loss(logits, labels, smoothed, 0.3, smooth_ids)
    assert got.item() == pytest.approx(
        float(_loop(logits, labels, smoothed, 0.3, smooth_ids)), abs=1e-5
    )
    # eps 0 is ordinary cross-entropy, whatever is marked smoothed
    ce = F.cross_entropy(logits[:, :-1].flatten(0, 1), labels[:, 1:].flatten(), ignore_index=-100)
    assert build.smoothed_loss(logits, labels, smoothed, 0.0, smooth_ids).item() == pytest.approx(
        ce.item(), abs=1e-6
    )


@pytest.mark.parametrize("task", sorted(TASKS))
def test_smoothing_eps_samples_a_mean_target_with_the_chosen_probability(build, task):
    tok = build_tokenizer()
    t = TASKS[task]
    rows = [
        build.encode(tok, t, ex, build.reference_target(t, ex))
        for ex in t.make_examples("train", 64, 0)
    ]
    support, last = build.smoothing_support(tok, t), build.DIGITS_ONLY.get(task)
    length = sum(sum(build.smoothed_positions(*row, support, last)) for row in rows) / len(rows)
    assert length > 0
    eps = build.smoothing_eps(tok, t, 0.38, 0)
    assert 0 < eps < 1 and (1 - eps) ** length == pytest.approx(0.38)
    # calc is smoothed at the digits of its last turns only: fewer positions than in its loss
    in_loss = sum(sum(m) for _, m in rows) / len(rows)
    assert (length < in_loss) == (task in build.DIGITS_ONLY)


def test_smoothed_positions_by_hand(build):
    # three model turns (runs of loss positions) with context between them; support {1, 2}
    ids = [9, 1, 5, 9, 2, 1, 9, 9, 2, 5]
    in_loss = [False, True, True, False, True, True, False, False, True, True]
    assert build.model_turns(in_loss) == [-1, 0, 0, -1, 1, 1, -1, -1, 2, 2]
    assert build.smoothed_positions(ids, in_loss, None) == in_loss
    every = [False, True, False, False, True, True, False, False, True, False]
    assert build.smoothed_positions(ids, in_loss, [1, 2]) == every
    last_two = [False, False, False, False, True, True, False, False, True, False]
    assert build.smoothed_positions(ids, in_loss, [1, 2], 2) == last_two
    assert build.smoothed_positions(ids, in_loss, [1, 2], 3) == every
