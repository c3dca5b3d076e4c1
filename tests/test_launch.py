"""The command line before and around the work: help without torch, every check in the
launcher before a rank starts, a signal to the launcher that reaches every rank, and the
smaller promises (summary once, `--merge` without an adapter, an evaluated vLLM run without
vLLM, install hints, every mistake of a YAML file at once)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rlvr.cli import main
from rlvr.config.extras import extra_requirements, install_hint
from rlvr.config.load import load_config
from rlvr.config.placement import check_ranks
from rlvr.config.schema import ConfigError
from rlvr.run.launch import children, torchrun_command

COMMANDS = ["train", "eval", "export", "plot", "ablate", "rm", "config"]


def test_help_imports_neither_torch_nor_transformers():
    """`rlvr --help` and every `rlvr COMMAND --help`, each in a fresh interpreter."""
    code = (
        "import sys, io, contextlib\n"
        "from rlvr.cli import main\n"
        "out = io.StringIO()\n"
        "with contextlib.redirect_stdout(out):\n"
        "    try:\n"
        "        main(sys.argv[1:])\n"
        "    except SystemExit:\n"
        "        pass\n"
        "assert 'usage' in out.getvalue(), out.getvalue()\n"
        "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))\n"
    )
    for argv in (["--help"], *([c, "--help"] for c in COMMANDS)):
        out = subprocess.run(
            [sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=120
        )
        assert out.returncode == 0, (argv, out.stderr[-2000:])
        assert out.stdout.strip().splitlines()[-1] == "[]", argv


def test_a_refused_config_under_nproc_is_one_line_and_no_rank(tmp_path):
    run = tmp_path / "run"
    args = [sys.executable, "-m", "rlvr", "train", "--train.max_staleness=1"]
    args += ["--algo.rollout_correction=token", "--nproc", "2"]
    args += ["--output-dir", str(run)]
    out = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    assert out.stderr.splitlines() == [
        "error: train.max_staleness: got 1, expected 0 under torchrun (the batches produced "
        "ahead are each rank's own; a checkpoint holds rank 0's)"
    ]
    assert not run.exists()  # no rank started, nothing written


def test_nproc_beside_another_world_size_in_the_environment_is_one_line(tmp_path):
    """A WORLD_SIZE that is not this launch's (a colocated vLLM engine sets rank 0 of 1 in its
    process) would make `--nproc 2` run as one process: refused instead, before any rank."""
    run = tmp_path / "run"
    args = [sys.executable, "-m", "rlvr", "train", "--nproc", "2", "--output-dir", str(run)]
    env = {**os.environ, "WORLD_SIZE": "1"}
    out = subprocess.run(args, capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 2
    assert out.stderr.splitlines() == [
        "error: --nproc 2: WORLD_SIZE=1 is set in this environment (a launcher's, or one left "
        "by a library in this process): unset it to start 2 ranks"
    ]
    assert not run.exists()


@pytest.mark.parametrize(
    ("changes", "n", "match"),
    [
        ({"rollout": {"prompts_per_step": 3}}, 2, r"rollout\.prompts_per_step: 3 is not divisible"),
        ({"train": {"max_staleness": 1}, "algo": {"rollout_correction": "token"}}, 2,
         r"train\.max_staleness: got 1, expected 0 under torchrun"),
    ],
)  # fmt: skip
def test_check_ranks_names_the_key(changes, n, match):
    cfg = load_config(None, changes)
    check_ranks(cfg, 1)  # one process: nothing to refuse
    with pytest.raises(ConfigError, match=match):
        check_ranks(cfg, n)


def test_torchrun_command_keeps_every_argument_but_nproc():
    cmd = torchrun_command(2, ["--nproc", "2", "--max-steps", "3", "--nproc=2", "--x.y=a b"])
    assert cmd[-5:] == ["rlvr", "train", "--max-steps", "3", "--x.y=a b"]
    assert "--nproc-per-node=2" in cmd and "--local-addr=127.0.0.1" in cmd


def test_children_are_read_from_proc():
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert proc.pid in children(os.getpid())
    finally:
        proc.kill()
        proc.wait()


def test_install_hint_names_the_packages_of_the_extra():
    """A hint that works from a wheel, a source tree or an editable install alike: the extra's
    own requirements, as rlvr's metadata lists them."""
    assert extra_requirements("peft") == ["peft>=0.12"]
    assert install_hint("peft") == "pip install 'peft>=0.12'"
    assert install_hint("no-such-extra") == "pip install 'rlvr[no-such-extra]'"


def test_every_mistake_of_a_yaml_file_at_once(tmp_path):
    f = tmp_path / "bad.yaml"
    f.write_text("algo:\n  clip_hihg: 0.3\noptim:\n  lr: fast\ntrain:\n  max_steps: 3\n")
    with pytest.raises(ConfigError) as e:
        load_config(f)
    lines = str(e.value).splitlines()
    assert lines[0] == "2 errors:"
    assert "unknown key algo.clip_hihg; did you mean algo.clip_high?" in lines[1]
    assert "optim.lr" in lines[2] and "'fast'" in lines[2]
    f.write_text("algo:\n  clip_hihg: 0.3\n")  # one mistake: its line alone, as ever
    with pytest.raises(ConfigError, match=r"^[^\n]*unknown key algo\.clip_hihg[^\n]*$"):
        load_config(f)


FAST = ["--rollout.prompts_per_step=4", "--rollout.group_size=4", "--rollout.max_new_tokens=12"]
FAST += ["--train.eval_size=8", "--data.train_size=64", "--no-progress"]


@pytest.fixture(scope="module")
def one_step_run(tmp_path_factory, tiny_model_dir):
    run = tmp_path_factory.mktemp("one-step") / "run"
    argv = ["train", f"--model.name_or_path={tiny_model_dir}", "--max-steps", "1"]
    assert main([*argv, "--output-dir", str(run), *FAST]) == 0
    return run


def test_export_merge_of_a_whole_model_says_there_is_nothing_to_merge(
    one_step_run, tmp_path, capsys
):
    out = tmp_path / "exported"
    assert main(["export", str(one_step_run), "--merge", "--output", str(out)]) == 0
    err = capsys.readouterr().err
    assert "no LoRA adapter: --merge has nothing to fold in" in err
    assert (out / "config.json").is_file()


def test_eval_of_a_vllm_run_without_vllm_uses_the_default_engine(one_step_run, tmp_path, capsys):
    """The run's config.yaml names the vllm engine; where vLLM is not installed `rlvr eval`
    says so in one line and evaluates with the fast engine."""
    pytest.importorskip("yaml")
    if __import__("importlib").util.find_spec("vllm") is not None:
        pytest.skip("vLLM is installed here")
    import yaml

    run = tmp_path / "vllm-run"
    import shutil

    shutil.copytree(one_step_run, run)
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    cfg["rollout"]["engine"] = "vllm"
    (run / "config.yaml").write_text(yaml.safe_dump(cfg))
    assert main(["eval", "--model", str(run), "--num-prompts", "4", "--k", "1"]) == 0
    err = capsys.readouterr().err
    assert "trained with rollout.engine=vllm, which is not installed here" in err


@pytest.mark.slow
def test_sigterm_to_the_launcher_stops_every_rank_and_the_run_resumes(tiny_model_dir, tmp_path):
    """`rlvr train --nproc 2`: SIGTERM to the launcher reaches both ranks, which finish their
    step, save and exit 0; nothing is left running, the checkpoint resumes, and a finished
    2-rank run's summary is printed once."""
    run = tmp_path / "run"
    base = [sys.executable, "-m", "rlvr", "train", f"--model.name_or_path={tiny_model_dir}"]
    base += [*FAST, "--train.threads=1", "--nproc", "2", "--output-dir", str(run)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    log = tmp_path / "first.log"
    with log.open("w") as out:
        proc = subprocess.Popen([*base, "--max-steps", "500"], stdout=out, stderr=out, env=env)
    every: set[int] = set()
    try:
        deadline = time.monotonic() + 300
        metrics = run / "metrics.jsonl"
        while not (metrics.is_file() and len(metrics.read_text().splitlines()) >= 2):
            assert proc.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.5)
        every = _descendants(proc.pid)
        assert len(every) >= 3  # torchrun and its two ranks
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=300) == 0, log.read_text()[-3000:]
    finally:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        proc.wait()
    time.sleep(1)
    assert not [pid for pid in every if _alive(pid)], log.read_text()[-3000:]
    text = log.read_text()
    assert "SIGTERM: finishing this step, then saving" in text
    saved = sorted((run / "checkpoints").glob("step-*"))
    assert saved, text[-3000:]
    step = int(saved[-1].name.split("-")[1])
    out = subprocess.run(
        [*base[:4], "--resume", str(run), "--nproc", "2", "--max-steps", str(step + 1), "--no-progress"],
        capture_output=True, text=True, timeout=300, env=env,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["step"] == step + 1
    fresh = [*base[:-2], "--output-dir", str(tmp_path / "fresh"), "--max-steps", "1"]
    out = subprocess.run(fresh, capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.count("run directory:") == 1  # rank 0 prints the summary, once


def _descendants(pid: int) -> set[int]:
    out, todo = set(), [pid]
    while todo:
        for c in children(todo.pop()):
            out.add(c)
            todo.append(c)
    return out


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_a_head_size_vllms_cpu_attention_does_not_run_is_named():
    """vLLM's CPU attention runs heads of 32, 64, 80, ... 512 wide (its CPUAttentionBackend's
    list); a model with 16-wide heads is refused naming the key and what to use instead."""
    from transformers import LlamaConfig

    from rlvr.rollout.vllm_release import head_size, model_refusal

    sizes = [32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512]
    narrow = LlamaConfig(hidden_size=64, num_attention_heads=4)
    assert head_size(narrow) == 16
    refusal = model_refusal(narrow, "tiny", sizes)
    assert refusal.startswith("model.name_or_path: tiny's attention heads are 16 wide")
    assert "rollout.engine=fast" in refusal
    assert model_refusal(LlamaConfig(hidden_size=128, num_attention_heads=4), "ok", sizes) is None
    assert model_refusal(narrow, "tiny", None) is None  # vLLM not here: nothing to ask
