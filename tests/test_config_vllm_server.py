"""The vllm engine's server-mode keys (`rollout.vllm.mode/urls/launch/cpus/gpus/timeout`,
docs/guides/vllm_server.md): each mistake is one ConfigError naming the key, at load, before
any server starts; the keys that only say where the servers run may change on resume. No
vLLM needed (tests/test_vllm_server.py runs the servers)."""

from __future__ import annotations

import pytest

import rlvr.config.placement
from rlvr.config.load import load_config
from rlvr.config.schema import ConfigError
from rlvr.run.stored_config import check_resume_changes

SERVER = ["--rollout.engine=vllm", "--rollout.vllm.mode=server"]


@pytest.fixture()
def vllm_here(monkeypatch):
    """Server mode's keys checked as where vLLM is installed."""
    monkeypatch.setattr(rlvr.config.placement, "vllm_installed", lambda: True)


def test_urls_and_launch_load_from_the_command_line_and_a_file(vllm_here, tmp_path):
    cfg = load_config(None, [*SERVER, "--rollout.vllm.urls=http://10.0.0.5:8000,http://h:9/"])
    assert cfg.rollout.vllm.urls == ("http://10.0.0.5:8000", "http://h:9/")
    f = tmp_path / "c.yaml"
    f.write_text(
        "rollout:\n  engine: vllm\n  vllm:\n    mode: server\n    launch: 2\n"
        "    cpus: 0-1\n    timeout: 5\n"
    )
    v = load_config(f).rollout.vllm
    assert (v.mode, v.launch, v.cpus, v.timeout, v.urls) == ("server", 2, "0-1", 5.0, ())


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--rollout.vllm.mode=server"], "rollout.vllm.mode: server needs rollout.engine=vllm"),
        (SERVER, "rollout.vllm.mode: server needs rollout.vllm.urls (running servers) or"),
        ([*SERVER, "--rollout.vllm.urls=http://a:1", "--rollout.vllm.launch=1"],
         "rollout.vllm.launch: got 1 with rollout.vllm.urls set; give one"),
        ([*SERVER, "--rollout.vllm.urls=localhost:8000"],
         "rollout.vllm.urls: got 'localhost:8000', expected a server's root URL"),
        ([*SERVER, "--rollout.vllm.urls=http://a:1/v1"],
         "rollout.vllm.urls: got 'http://a:1/v1', expected a server's root URL"),
        ([*SERVER, "--rollout.vllm.urls=http://a"],
         "rollout.vllm.urls: got 'http://a', expected"),
        ([*SERVER, "--rollout.vllm.urls=http://a:1,http://a:1/"],
         "rollout.vllm.urls: got ['http://a:1', 'http://a:1/'], a server listed twice"),
        (["--rollout.engine=vllm", "--rollout.vllm.urls=http://a:1"],
         "rollout.vllm.urls: got ('http://a:1',), but rollout.vllm.mode is 'colocate'"),
        (["--rollout.vllm.launch=2"], "rollout.vllm.launch: got 2, but rollout.vllm.mode is"),
        ([*SERVER, "--rollout.vllm.launch=-1"], "rollout.vllm.launch: got -1, expected >= 0"),
        ([*SERVER, "--rollout.vllm.launch=2", "--rollout.vllm.cpus=0"],
         "rollout.vllm.cpus: got '0' (1), which does not split evenly among the 2 launched"),
        ([*SERVER, "--rollout.vllm.launch=1", "--rollout.vllm.cpus=x"],
         "rollout.vllm.cpus: got 'x', expected CPUs like 0 or 0-3,8"),
        ([*SERVER, "--rollout.vllm.launch=1", "--rollout.vllm.cpus=4096"],
         "rollout.vllm.cpus: got '4096', expected CPUs among those this machine has"),
        ([*SERVER, "--rollout.vllm.launch=2", "--rollout.vllm.gpus=0,1,2"],
         "rollout.vllm.gpus: got '0,1,2' (3), which does not split evenly among the 2"),
        ([*SERVER, "--rollout.vllm.launch=1", "--rollout.vllm.gpus=a"],
         "rollout.vllm.gpus: got 'a', expected GPU indices like 1,2"),
        ([*SERVER, "--rollout.vllm.urls=http://a:1", "--rollout.vllm.cpus=0"],
         "rollout.vllm.cpus: places launched servers, but rollout.vllm.launch is 0"),
        ([*SERVER, "--rollout.vllm.launch=1", "--rollout.vllm.timeout=0"],
         "rollout.vllm.timeout: got 0.0, expected > 0 seconds"),
    ],
)  # fmt: skip
def test_each_mistake_is_one_error_naming_the_key(vllm_here, args, message):
    with pytest.raises(ConfigError) as e:
        load_config(None, args)
    assert str(e.value).startswith(message), str(e.value)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("key", ["enabled=true", "cpus=0", "trainer_cpus=1", "device=cpu"])
def test_the_removed_rollout_server_is_one_line_naming_server_mode(key):
    """Any rollout.server setting but its old defaults (which old config.yaml files hold and
    which load as before) names the replacement."""
    with pytest.raises(ConfigError) as e:
        load_config(None, [f"--rollout.server.{key}"])
    assert str(e.value) == (
        f"command line: rollout.server.{key.split('=')[0]}: the rollout server is removed: "
        "generation beside training runs on vLLM servers, --rollout.engine=vllm "
        "--rollout.vllm.mode=server --rollout.vllm.launch=1 --train.max_staleness=K "
        "(docs/guides/vllm_server.md)"
    )
    old = {"rollout": {"server": {"enabled": False, "cpus": "", "trainer_cpus": "", "device": ""}}}
    assert load_config(None, old) == load_config(None, [])


def test_server_mode_without_vllm_installed_is_refused_by_name(monkeypatch):
    monkeypatch.setattr(rlvr.config.placement, "vllm_installed", lambda: False)
    with pytest.raises(ConfigError, match=r"^rollout.vllm.mode: server needs vLLM installed"):
        load_config(None, [*SERVER, "--rollout.vllm.launch=1"])


def test_server_mode_runs_under_torchrun_and_staleness_in_one_process(vllm_here):
    """N ranks share the servers (rank 0 pushes); a batch ahead is each rank's own, so
    staleness stays one process's, in server mode as elsewhere."""
    from rlvr.config.placement import check_ranks

    check_ranks(load_config(None, [*SERVER, "--rollout.vllm.launch=1"]), 2)  # no error
    stale = [*SERVER, "--rollout.vllm.launch=1", "--train.max_staleness=1",
             "--algo.rollout_correction=token"]  # fmt: skip
    cfg = load_config(None, stale)  # no error: one process
    with pytest.raises(ConfigError, match=r"^train.max_staleness: got 1, expected 0 under torch"):
        check_ranks(cfg, 2)


def test_where_the_servers_run_may_change_on_resume(vllm_here):
    stored = load_config(None, [*SERVER, "--rollout.vllm.urls=http://a:1"])
    moved = load_config(None, [*SERVER, "--rollout.vllm.launch=2", "--rollout.vllm.timeout=9"])
    check_resume_changes(stored, moved)  # no error: the servers' places, not the math
    colocate = load_config(None, ["--rollout.engine=vllm"])
    with pytest.raises(ConfigError, match=r"rollout\.vllm\.mode"):
        check_resume_changes(stored, colocate)
