"""The memory model (rlvr.run.memory) by hand, and the guard's one-line stop before a step that
would not fit, down to the CLI's exit code (an artificially small RLVR_MEMORY_LIMIT_GB: nothing
large is allocated)."""

from __future__ import annotations

import pytest

from rlvr.run import memory
from rlvr.run.memory import MemoryBudgetError, MemoryGuard, Shape, Work, available_bytes, predict

SHAPE = Shape(layers=2, hidden=4, intermediate=8, kv=2, vocab=10, params=100, trainable=100)
WORK = Work(rows=4, micro_rows=2, prompt=3, response=5)


@pytest.fixture()
def unit(monkeypatch):
    """Constants at 1 and no runtime, so the parts are the formula's counts."""
    monkeypatch.setattr(memory, "RUNTIME", 0.0)
    monkeypatch.setattr(memory, "STATE", 1.0)
    monkeypatch.setattr(memory, "ACTIVATION", 1.0)
    monkeypatch.setattr(memory, "GC_LAYERS", 1.0)
    monkeypatch.setattr(memory, "LORA_ACTIVATION", 1.0)


def test_predict_by_hand(unit):
    got = predict(SHAPE, WORK)
    # state: 4 x 100 weights + 12 x 100 (gradients, two AdamW moments)
    assert got["state"] == 1600
    # 2 rows x (3 + 5) tokens; per layer 10*4 + 4*8 + 3*2 = 78 values, 2 layers
    assert got["activations"] == 4 * 16 * 2 * 78
    # the 10 response tokens fit one scoring chunk: the logits in one piece, 3 x 10 a token
    assert got["logits"] == 4 * 16 * 30
    # K and V, fp32, per layer and position: 8 x 2 layers x 2 kv x 4 rows x 8 positions
    assert got["kv_cache"] == 8 * 2 * 2 * 4 * 8
    assert got["total"] == 1600 + 11904 + 1024
    assert got["engine"] == 0.0


def test_an_engine_that_stays_resident_counts(unit):
    """vLLM on the CPU keeps its weights and KV cache through the update: on top."""
    got = predict(SHAPE, Work(4, 2, 3, 5, engine_bytes=5000))
    assert got["engine"] == 5000 and got["total"] == 1600 + 11904 + 1024 + 5000


def test_the_code_rewards_sandboxes_count(unit, monkeypatch):
    """What the code reward's sandboxes may hold at once is on top, and a stop names its
    knobs."""
    got = predict(SHAPE, Work(4, 2, 3, 5, sandbox_bytes=7000))
    assert got["sandboxes"] == 7000 and got["total"] == 1600 + 11904 + 1024 + 7000
    monkeypatch.setenv("RLVR_MEMORY_LIMIT_GB", "0.001")
    with pytest.raises(MemoryBudgetError) as e:
        MemoryGuard(SHAPE, Work(4, 2, 3, 5, sandbox_bytes=2**30)).check(1)
    assert "sandboxes may hold 1.0 GiB" in str(e.value)
    assert "reward.params.code.workers" in str(e.value)


def test_prompt_sharing_checkpointing_and_reference(unit, monkeypatch):
    shared = predict(SHAPE, Work(4, 2, 3, 5, groups_per_micro=1))
    assert shared["activations"] == 4 * (3 + 2 * 5) * 2 * 78  # the prompt once
    gc = predict(SHAPE, Work(4, 2, 3, 5, gradient_checkpointing=True))
    assert gc["activations"] == 4 * 16 * (2 * 4 + 78)  # layer inputs + one live layer
    ref = predict(SHAPE, Work(4, 2, 3, 5, reference_copy=True))
    assert ref["state"] == 1600 + 400
    lora = predict(Shape(2, 4, 8, 2, 10, params=100, trainable=7), WORK)
    assert lora["state"] == 400 + 12 * 7
    monkeypatch.setattr(memory, "LORA_ACTIVATION", 1.5)  # under half trained: LoRA's factor
    for trained, factor in ((49, 1.5), (50, 1.0)):
        got = predict(Shape(2, 4, 8, 2, 10, 100, trained), WORK)
        assert got["activations"] + got["logits"] == factor * 11904


def test_gc_layers_and_multipliers(unit, monkeypatch):
    monkeypatch.setattr(memory, "GC_LAYERS", 2.5)
    monkeypatch.setattr(memory, "ACTIVATION", 0.5)
    monkeypatch.setattr(memory, "STATE", 2.0)
    got = predict(SHAPE, Work(4, 2, 3, 5, gradient_checkpointing=True))
    assert got["activations"] == 0.5 * 4 * 16 * (2 * 4 + 2.5 * 78)
    assert got["logits"] == 0.5 * 4 * 16 * 30
    assert got["state"] == 2 * 1600


def test_chunked_logits(unit):
    """Scored in chunks of 4 of the 10 response tokens: one chunk's vocabulary-wide tensors
    (24 bytes x 10 entries x 4 tokens) and the hidden states' 12 bytes x 4 wide a token,
    whatever the multipliers."""
    got = predict(SHAPE, Work(4, 2, 3, 5, logits_chunk=4))
    assert got["logits"] == 24 * 10 * 4 + 12 * 10 * 4
    assert got["activations"] == 4 * 16 * 2 * 78
    # a real vocabulary: 256 MiB of chunk whatever the length, instead of 3 x 4 V a token
    big = Shape(2, 4, 8, 2, 151_936, 100, 100)
    short, long = (predict(big, Work(8, 8, 47, t))["logits"] for t in (1024, 16384))
    assert short == long - 12 * 8 * (16384 - 1024) * 4 < 260 * 2**20


def test_runtime_and_multipliers_apply():
    base = predict(SHAPE, WORK)
    assert base["runtime"] == memory.RUNTIME
    assert base["total"] == pytest.approx(sum(v for k, v in base.items() if k != "total"))


def test_guard_stops_with_one_line_naming_the_knobs(monkeypatch):
    monkeypatch.setenv("RLVR_MEMORY_LIMIT_GB", "0.001")
    guard = MemoryGuard(SHAPE, WORK)
    with pytest.raises(MemoryBudgetError) as e:
        guard.check(3)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("step 3 would need about")
    for knob in ("rollout.max_new_tokens (5)", "optim.micro_batch_sequences (2)",
                 "rollout.prompts_per_step x group_size (4)", "optim.gradient_checkpointing=true",
                 "RLVR_MEMORY_LIMIT_GB", "RLVR_MEMORY_GUARD=0"):  # fmt: skip
        assert knob in msg
    on = MemoryGuard(SHAPE, Work(4, 2, 3, 5, gradient_checkpointing=True))
    with pytest.raises(MemoryBudgetError) as e:
        on.check(1)
    assert "gradient_checkpointing" not in str(e.value)


def test_guard_passes_when_it_fits_and_can_be_turned_off(monkeypatch):
    monkeypatch.setenv("RLVR_MEMORY_LIMIT_GB", "1000")
    MemoryGuard(SHAPE, WORK).check(1)
    monkeypatch.setenv("RLVR_MEMORY_LIMIT_GB", "0.001")
    monkeypatch.setenv("RLVR_MEMORY_GUARD", "0")
    MemoryGuard(SHAPE, WORK).check(1)
    MemoryGuard(None, WORK).check(1)  # no Llama-style config: nothing to predict


def test_bad_limit_is_named(monkeypatch):
    monkeypatch.setenv("RLVR_MEMORY_LIMIT_GB", "lots")
    with pytest.raises(MemoryBudgetError, match="RLVR_MEMORY_LIMIT_GB='lots': expected"):
        MemoryGuard(SHAPE, WORK).check(1)


def test_available_is_meminfo_plus_rss(monkeypatch):
    monkeypatch.delenv("RLVR_MEMORY_LIMIT_GB", raising=False)
    have, source = available_bytes()
    with open("/proc/meminfo") as f:
        avail = next(int(x.split()[1]) * 1024 for x in f if x.startswith("MemAvailable:"))
    assert source.startswith("MemAvailable")
    # RSS is positive and well under 64 GiB; MemAvailable moves a little between the reads
    assert avail - 2**28 < have < avail + 64 * memory.GIB


def test_shape_of_a_real_model(tiny_model):
    s = Shape.of(tiny_model)
    c = tiny_model.config
    assert (s.layers, s.hidden, s.intermediate, s.vocab) == (2, 32, 64, c.vocab_size)
    assert s.kv == 1 * (32 // 2)  # one key/value head of 16
    assert s.params == s.trainable == sum(p.numel() for p in tiny_model.parameters())
    tiny_model.model.embed_tokens.weight.requires_grad_(False)
    assert Shape.of(tiny_model).trainable == s.params - tiny_model.model.embed_tokens.weight.numel()


def test_weights_off_the_cpu_are_not_guarded(tiny_model, monkeypatch):
    from types import SimpleNamespace

    monkeypatch.setenv("RLVR_MEMORY_LIMIT_GB", "0.001")
    cfg = SimpleNamespace(
        rollout=SimpleNamespace(prompts_per_step=2, group_size=4, max_new_tokens=8),
        optim=SimpleNamespace(
            micro_batch_sequences=4,
            micro_batch_tokens=0,
            share_prompt=True,
            gradient_checkpointing=False,
            logits_chunk_tokens=0,
        ),
    )
    guard = MemoryGuard.for_run(cfg, tiny_model, 10, False)
    assert guard.work == Work(8, 4, 10, 8, groups_per_micro=1)
    with pytest.raises(MemoryBudgetError):
        guard.check(1)
    meta = tiny_model.to("meta")  # not on the CPU: host RAM is not what it uses
    MemoryGuard.for_run(cfg, meta, 10, False).check(1)


def test_cli_stops_before_the_first_step(tmp_path, capsys, monkeypatch):
    from rlvr.cli.main import main

    monkeypatch.setenv("RLVR_MEMORY_LIMIT_GB", "0.01")
    rc = main(["train", "--output-dir", str(tmp_path / "run"), "--train.max_steps=1",
               "--train.eval_size=0", "--rollout.prompts_per_step=2", "--rollout.group_size=2",
               "--no-progress"])  # fmt: skip
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2
    assert err[-1].startswith("error: step 1 would need about")
    assert "rollout.max_new_tokens" in err[-1] and "0.0 GiB is available" in err[-1]
    assert not any("Traceback" in line for line in err)
    assert (
        not (tmp_path / "run" / "metrics.jsonl").exists()
        or not (tmp_path / "run" / "metrics.jsonl").read_text()
    )
