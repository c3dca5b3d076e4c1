"""Shared fixtures: tiny randomly initialised Llama and Qwen2 models and their tokenizer, saved with
save_pretrained to a local directory, exactly as a user's model would be, and the loopback server
the sandbox suites probe.

This is the suite's only conftest.py: test modules import `require_native_kernels` from it by
name (`from conftest import ...`), which a second conftest.py in a subfolder would shadow."""

import os
import shutil
import socket
import threading

import pytest
import torch

from rlvr.models import build_tiny_model, build_tokenizer

# Two threads, as on every host of this project's kind, so the suite's arithmetic is the same
# on a bigger machine; an explicit OMP_NUM_THREADS (the arithmetic guard in
# scripts/cpu_capabilities.sh runs with 1) is honoured.
torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS") or 2))


def require_native_kernels() -> None:
    """Skip, with the reason, where the C kernels are off by choice (`RLVR_NATIVE=0`) or for
    want of a compiler; fail where a compiler is here and they did not build."""
    from rlvr.cpu import native

    if native.available():
        return
    if os.environ.get("RLVR_NATIVE") == "0" or not (
        os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    ):
        pytest.skip(f"C kernels {native.status()}")
    pytest.fail(f"the C kernels did not build: {native.status()}")


@pytest.fixture()
def native_kernels() -> None:
    """For tests of the C kernels themselves (see `require_native_kernels`)."""
    require_native_kernels()


@pytest.fixture()
def one_thread():
    """Torch on one thread for the test: a server child that decodes a tiny model is faster
    so, and its log-probs are compared with the in-process engine's on the same count."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def tokenizer():
    return build_tokenizer()


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, tokenizer):
    path = tmp_path_factory.mktemp("tiny-llama")
    model = build_tiny_model(
        tokenizer,
        seed=0,
        hidden_size=32,
        num_layers=2,
        num_heads=2,
        num_kv_heads=1,
        intermediate_size=64,
        max_position_embeddings=128,
    )
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture()
def tiny_model(tiny_model_dir):
    from rlvr.models import load_model

    return load_model(str(tiny_model_dir)).eval()


@pytest.fixture(scope="session")
def tiny_qwen2_dir(tmp_path_factory, tokenizer):
    """A tiny randomly initialised Qwen2 (the architecture users bring most often)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        intermediate_size=64,
        max_position_embeddings=128,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
        tie_word_embeddings=True,
    )
    path = tmp_path_factory.mktemp("tiny-qwen2-arch")
    Qwen2ForCausalLM(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def scaled_tiny_model(tokenizer):
    """A small `build_tiny_model`, its matrices scaled up: at init a Qwen2 this narrow is
    nearly uniform and greedy decoding repeats one token; scaled, its outputs vary."""
    model = build_tiny_model(
        tokenizer,
        seed=0,
        hidden_size=64,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        intermediate_size=128,
        max_position_embeddings=128,
    ).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(10.0)
    return model


@pytest.fixture()
def server():
    """A TCP server on 127.0.0.1: yields (port, the first bytes of each accepted connection),
    so a test can prove that a sandboxed program did or did not reach the loopback."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    srv.settimeout(0.2)
    accepted, stop = [], threading.Event()

    def loop():
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except OSError:
                continue
            accepted.append(conn.recv(100))
            conn.close()

    t = threading.Thread(target=loop, daemon=True)
    t.start()
    yield srv.getsockname()[1], accepted
    stop.set()
    t.join()
    srv.close()


def small_run_args(model_dir, run, steps: int = 2) -> list[str]:
    """`rlvr train` arguments of a 2-step GRPO run on the tiny model, a checkpoint every step."""
    rewards = os.path.join(os.path.dirname(__file__), "e2e_rewards.py")
    return [
        *("train", "--preset", "grpo", f"--model.name_or_path={model_dir}"),
        f"--reward.extra={rewards}:digit_share=1.0",
        *("--rollout.prompts_per_step=4", "--rollout.group_size=4"),
        *("--rollout.max_new_tokens=10", "--train.eval_size=8", "--data.train_size=64"),
        *("--optim.lr=1e-3", "--train.threads=1", "--save-every", "1"),
        *("--max-steps", str(steps), "--output-dir", str(run), "--no-progress"),
    ]


@pytest.fixture(scope="session")
def small_run(tiny_model_dir, tmp_path_factory):
    """A finished 2-step run directory (checkpoints at steps 1 and 2), trained in process
    (~5 s); copy it before changing it."""
    from rlvr.cli.main import main

    run = tmp_path_factory.mktemp("small-run") / "run"
    assert main(small_run_args(tiny_model_dir, run)) == 0
    return run


# `rlvr train` with no arguments (the DAPO preset, the built-in model and task, 100 steps) with
# a 128-prompt held-out evaluation: tests/test_tasks_learn.py's arithmetic run
DEFAULT_RUN_ARGS = ["train", "--train.eval_size=128", "--no-progress"]


@pytest.fixture(scope="session")
def default_run(tmp_path_factory):
    """The default run's finished directory, trained once for the slow tests that read it: the
    arithmetic task's learning test asserts on it, on-policy distillation takes it as the
    teacher. Read it, never change it."""
    from rlvr.cli.main import main

    run = tmp_path_factory.mktemp("default-run") / "run"
    assert main([*DEFAULT_RUN_ARGS, "--output-dir", str(run)]) == 0
    return run


SAME_RUN_HELPERS = {"assert_same_run", "assert_same_weights", "run_differences"}


def pytest_collection_modifyitems(items):
    """A test that compares through tests/same_run.py compares two runs of the same math:
    it is marked `compares_runs`, so the arithmetic guard (scripts/cpu_capabilities.sh) reruns
    it under other kernels and one thread without anyone having to remember the marker."""
    for item in items:
        code = getattr(getattr(item, "function", None), "__code__", None)
        if code is not None and SAME_RUN_HELPERS & set(code.co_names):
            item.add_marker(pytest.mark.compares_runs)


def update_context(cfg, model, pad_id: int = 0, device="cpu", **counts):
    """The `UpdateContext` a run's step gives `model` under `cfg` (its algorithm built from
    the config), with `num_tokens` / `num_sequences` when given."""
    from dataclasses import replace

    from rlvr.config.algorithm import Algorithm
    from rlvr.training.settings import step_context

    return replace(step_context(cfg, Algorithm.from_config(cfg), model, pad_id, device), **counts)
