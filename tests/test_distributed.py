"""Data parallelism on the CPU (gloo): 2 processes compute the same update as 1.

Same global batch and seed; weights after each of 3 steps agree within 1e-5 (fp32), with
dynamic sampling on, for token_mean and sample_mean, under DDP and under FSDP2. The accuracy reward (a digit in the
response) gives a random model mixed groups, so dynamic sampling really filters."""

import contextlib
import itertools
import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from rlvr.run.distributed import Dist
from same_run import assert_same_run, assert_same_weights

HERE = Path(__file__).parent
ACCURACY = f"{HERE / 'e2e_rewards.py'}:has_digit"


def _train(model_dir, run, nproc, agg, parallel="ddp", steps=3, resume=False, extra=()):
    args = [
        sys.executable,
        "-m",
        "rlvr",
        "train",
        "--preset",
        "dapo",
        f"--model.name_or_path={model_dir}",
        f"--reward.accuracy={ACCURACY}",
        f"--algo.agg={agg}",
        "--rollout.prompts_per_step=4",
        "--rollout.group_size=4",
        "--rollout.max_new_tokens=10",
        "--algo.overlong_cache=4",
        "--rollout.seed_per_prompt=true",
        "--train.eval_size=8",
        "--data.train_size=64",
        "--optim.lr=1e-3",
        "--optim.micro_batch_sequences=3",
        "--train.threads=1",
        "--save-every",
        "1",
        "--train.keep_checkpoints=5",
        "--max-steps",
        str(steps),
        "--output-dir",
        str(run),
        "--no-progress",
        "--nproc",
        str(nproc),
        f"--train.parallel={parallel}",
        *extra,
    ]
    rc, err = _run_group(args)
    assert rc == 0, err[-3000:]
    return run


_LAUNCHER = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def _no_launcher(env) -> dict:
    """The environment without torchrun's variables: a colocated vLLM engine earlier in this
    pytest process sets them (rank 0 of 1), and a launch must not read them as its own."""
    return {k: v for k, v in env.items() if k not in _LAUNCHER}


def _run_group(args, timeout=300, env=None):
    """Run in `env` (else this process's environment), without torchrun's variables, with
    output to a file (an orphaned rank holding a pipe would block reading it); on a timeout
    kill torchrun and every descendant: its ranks run in sessions of their own, so killing
    torchrun's group alone would leave them, and a hung collective with them."""
    with tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(
            args,
            stdout=subprocess.DEVNULL,
            stderr=err,
            text=True,
            env={**_no_launcher(os.environ if env is None else env), "OMP_NUM_THREADS": "1"},
        )
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            for pid in [*_descendants(proc.pid), proc.pid]:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            proc.wait()
            err.seek(0)
            raise AssertionError(
                f"timed out after {timeout} s (a collective hung?)\n{err.read()[-3000:]}"
            ) from None
        err.seek(0)
        return proc.returncode, err.read()


def _descendants(pid: int) -> list[int]:
    """Every live descendant of `pid`, from /proc's parent links."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):
            # the field after the ")" that closes the command name: state, then ppid
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(stat.parent.name))
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


@pytest.mark.parametrize("n", [0, 1, 3, 4, 7, 16])
@pytest.mark.parametrize("world", [1, 2, 3])
def test_shards_cover_a_batch_in_order(n, world):
    """Every rank's contiguous share, in rank order, is the whole batch; shares differ by at
    most one (an adaptive refill need not divide by the number of ranks)."""
    shares = [Dist(rank=r, world_size=world).shard(n) for r in range(world)]
    assert shares[0][0] == 0 and shares[-1][1] == n
    assert all(a[1] == b[0] for a, b in itertools.pairwise(shares))
    sizes = [hi - lo for lo, hi in shares]
    assert max(sizes) - min(sizes) <= 1


@pytest.mark.slow
@pytest.mark.parametrize("parallel", ["ddp", "fsdp2"])
@pytest.mark.parametrize("agg", ["token_mean", "sample_mean"])
def test_two_ranks_match_one(tiny_model_dir, tmp_path, agg, parallel):
    one = _train(tiny_model_dir, tmp_path / "one", 1, agg)
    two = _train(tiny_model_dir, tmp_path / "two", 2, agg, parallel)
    m1 = [json.loads(x) for x in (one / "metrics.jsonl").read_text().splitlines()]
    m2 = [json.loads(x) for x in (two / "metrics.jsonl").read_text().splitlines()]
    assert [r["groups/kept"] for r in m1] == [r["groups/kept"] for r in m2]
    assert any(r["groups/all_correct_frac"] + r["groups/all_wrong_frac"] > 0 for r in m1), (
        "dynamic sampling never filtered: the test would not exercise it"
    )
    # the same samples, rewards and kept groups exactly; the floats to fp32 rounding (each
    # rank sums its half of the batch, then the halves are reduced)
    keys = ("groups/generated", "reward/mean", "accuracy", "loss", "entropy")
    assert_same_run(m1, m2, keys=(*keys, "response/length_mean"))
    for step in (1, 2, 3):
        w1 = load_file(str(one / "checkpoints" / f"step-{step:06d}" / "model.safetensors"))
        w2 = load_file(str(two / "checkpoints" / f"step-{step:06d}" / "model.safetensors"))
        assert_same_weights(w1, w2, where=f"step {step}")
    start = load_file(str(tiny_model_dir / "model.safetensors"))
    assert any(not torch.equal(start[k], w2[k]) for k in start), "no update happened"
    s2 = json.loads((two / "summary.json").read_text())
    assert s2["world_size"] == 2 and s2["parallel"] == parallel


@pytest.mark.slow
@pytest.mark.parametrize(
    "extra",
    [
        ("--algo.rollout_correction=sequence",),
        ("--algo.rollout_bypass=true",),
    ],
    ids=["correction", "bypass"],
)
def test_two_ranks_match_one_under_rollout_correction(tiny_model_dir, tmp_path, extra):
    """The weights are per row and their metrics sums and a max: 2 ranks give 1's update and
    metrics, with mu = 2 (old log-probs from the trainer, or under bypass the engine's)."""
    extra = (*extra, "--algo.mu=2")
    one = _train(tiny_model_dir, tmp_path / "one", 1, "token_mean", steps=2, extra=extra)
    two = _train(tiny_model_dir, tmp_path / "two", 2, "token_mean", steps=2, extra=extra)
    m1 = [json.loads(x) for x in (one / "metrics.jsonl").read_text().splitlines()]
    m2 = [json.loads(x) for x in (two / "metrics.jsonl").read_text().splitlines()]
    keys = [k for k in m1[0] if k.startswith("rollout/is_")] + ["loss", "ratio_mean"]
    assert len(keys) == (7 if "--algo.rollout_bypass=true" not in extra else 2)
    assert_same_run(m1, m2, keys=keys)
    w1 = load_file(str(one / "checkpoints" / "step-000002" / "model.safetensors"))
    w2 = load_file(str(two / "checkpoints" / "step-000002" / "model.safetensors"))
    assert_same_weights(w1, w2)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("agg", "extra"),
    [
        ("token_mean", ("--algo.top_entropy_quantile=0.2",)),
        ("sample_mean", ("--algo.loss=gmpo", "--algo.top_entropy_quantile=0.5")),
    ],
)
def test_two_ranks_match_one_with_a_selection_over_both(tiny_model_dir, tmp_path, agg, extra):
    """The top-entropy threshold comes from histograms summed over both ranks: the same tokens
    are trained on, and the weights agree, as with one process."""
    one = _train(tiny_model_dir, tmp_path / "one", 1, agg, extra=extra)
    two = _train(tiny_model_dir, tmp_path / "two", 2, agg, extra=extra)
    m1 = [json.loads(x) for x in (one / "metrics.jsonl").read_text().splitlines()]
    m2 = [json.loads(x) for x in (two / "metrics.jsonl").read_text().splitlines()]
    keys = ("loss_tokens", "loss", "top_entropy_kept_frac", "top_entropy_threshold")
    assert_same_run(m1, m2, keys=keys)
    w1 = load_file(str(one / "checkpoints" / "step-000003" / "model.safetensors"))
    w2 = load_file(str(two / "checkpoints" / "step-000003" / "model.safetensors"))
    assert_same_weights(w1, w2)


@pytest.mark.slow
@pytest.mark.parametrize(
    "extra",
    [
        ("--algo.loss=clip_cov", "--algo.clip_cov_ratio=0.1", "--algo.clip_cov_lb=-10"),
        ("--algo.loss=kl_cov", "--algo.clip_high=0.2", "--algo.kl_cov_ratio=0.1"),
    ],
)
def test_two_ranks_match_one_with_a_covariance_selection(tiny_model_dir, tmp_path, extra):
    """Clip-Cov's and KL-Cov's means and k best tokens come from both ranks (two mini-batches,
    so rho moves): the same share is cut, and the weights agree, as with one process."""
    extra = (*extra, "--algo.mini_batches=2")
    one = _train(tiny_model_dir, tmp_path / "one", 1, "token_mean", extra=extra)
    two = _train(tiny_model_dir, tmp_path / "two", 2, "token_mean", extra=extra)
    m1 = [json.loads(x) for x in (one / "metrics.jsonl").read_text().splitlines()]
    m2 = [json.loads(x) for x in (two / "metrics.jsonl").read_text().splitlines()]
    assert all(a["cov_frac"] > 0 for a in m1)
    assert_same_run(m1, m2, keys=("loss_tokens", "loss", "cov_frac"))
    w1 = load_file(str(one / "checkpoints" / "step-000003" / "model.safetensors"))
    w2 = load_file(str(two / "checkpoints" / "step-000003" / "model.safetensors"))
    assert_same_weights(w1, w2)


@pytest.mark.slow
def test_fsdp2_checkpoint_resumes_on_one_process(tiny_model_dir, tmp_path):
    """2 sharded ranks for 2 steps, then 1 process resumes for the 3rd: the weights equal a
    run that was 1 process throughout (checkpoints hold whole weights and named state)."""
    one = _train(tiny_model_dir, tmp_path / "one", 1, "token_mean")
    mixed = _train(tiny_model_dir, tmp_path / "mixed", 2, "token_mean", "fsdp2", steps=2)
    rc, err = _run_group(
        [
            sys.executable,
            "-m",
            "rlvr",
            "train",
            "--resume",
            str(mixed),
            f"--reward.accuracy={ACCURACY}",
            "--max-steps=3",
            "--no-progress",
        ]
    )
    assert rc == 0, err[-3000:]
    w1 = load_file(str(one / "checkpoints" / "step-000003" / "model.safetensors"))
    w2 = load_file(str(mixed / "checkpoints" / "step-000003" / "model.safetensors"))
    assert_same_weights(w1, w2)


LOST = """
import os, signal, torch, torch.distributed as dist
import rlvr.run.distributed  # imported by every run: where user_error finds lost_rank
from rlvr.cli.main import user_error
dist.init_process_group("gloo")
t = torch.zeros(1)
dist.all_reduce(t)
if dist.get_rank() == 1:
    os.kill(os.getpid(), signal.SIGKILL)
try:
    dist.all_reduce(t)
except RuntimeError as e:
    print(user_error(e))
"""


def test_a_rank_whose_peer_is_killed_ends_with_one_line():
    """Two gloo ranks, rank 1 SIGKILLed after a first all-reduce: rank 0's next collective
    fails with gloo's own error, which `rlvr` prints as one line naming what happened
    (`rlvr.run.distributed.lost_rank`), exit 1. Other errors are not taken for it."""
    import socket

    from rlvr.run.distributed import lost_rank

    assert lost_rank(RuntimeError("a bug")) is None and lost_rank(ValueError("gloo/")) is None
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**_no_launcher(os.environ), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
           "WORLD_SIZE": "2", "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}  # fmt: skip
    procs = [subprocess.Popen([sys.executable, "-c", LOST], env={**env, "RANK": str(r)},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for r in (0, 1)]  # fmt: skip
    try:
        out, err = procs[0].communicate(timeout=120)
    finally:
        for p in procs:
            p.kill()
            p.wait()
    assert out.startswith("(1, 'torch.distributed: rank 0 lost contact with another rank ("), (out, err)  # fmt: skip
    assert out.rstrip().endswith("); --resume continues from the last checkpoint')"), out
    assert "by peer" in out, out  # gloo: "Connection closed by peer" or "reset by peer"
