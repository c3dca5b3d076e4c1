"""An engine's own config section (`rollout.vllm.dtype`, `rollout.vllm.memory`): written
nested or dotted, in a file, on the command line or from Python; the old flat names
(`rollout.vllm_dtype`, `rollout.vllm_memory`) applied with one note naming the new key, once a
process; listed by --help; compared key by key on resume, an old checkpoint's record included."""

from __future__ import annotations

import pytest

import rlvr.config.names
from rlvr.api.inputs import overrides
from rlvr.api.trl import trl_changes
from rlvr.config.load import dump_yaml, flat_keys, help_text, load_config, to_dict
from rlvr.config.schema import ConfigError
from rlvr.run.stored_config import check_resume_changes, config_differences

VLLM = {"engine": "vllm", "vllm": {"dtype": "bfloat16", "memory": 0.5}}


@pytest.fixture()
def fresh_notes(monkeypatch):
    """Each test sees the notes as a new process would (they print once a process)."""
    monkeypatch.setattr(rlvr.config.names, "_noted", set())


def test_the_section_nested_dotted_on_the_command_line_and_from_python(tmp_path):
    want = load_config(None, {"rollout": VLLM}).rollout
    assert (want.vllm.dtype, want.vllm.memory) == ("bfloat16", 0.5)
    dotted = {"engine": "vllm", "vllm.dtype": "bfloat16", "vllm.memory": 0.5}
    assert load_config(None, {"rollout": dotted}).rollout == want
    cli = ["--rollout.engine=vllm", "--rollout.vllm.dtype=bfloat16", "--rollout.vllm.memory=0.5"]
    assert load_config(None, cli).rollout == want
    api = {"rollout.engine": "vllm", "rollout.vllm.dtype": "bfloat16", "rollout.vllm.memory": 0.5}
    assert load_config(None, overrides(api)).rollout == want
    f = tmp_path / "c.yaml"
    f.write_text("rollout:\n  engine: vllm\n  vllm:\n    dtype: bfloat16\n    memory: 0.5\n")
    assert load_config(f).rollout == want
    only_memory = load_config(None, ["--rollout.vllm.memory=0.25"]).rollout.vllm
    assert (only_memory.dtype, only_memory.memory) == ("auto", 0.25)  # the other key kept


def test_a_written_config_loads_back_the_same(tmp_path):
    cfg = load_config(None, {"rollout": VLLM})
    f = tmp_path / "config.yaml"
    f.write_text(dump_yaml(cfg))
    assert "  vllm:\n    dtype: bfloat16\n    memory: 0.5\n" in f.read_text()
    assert load_config(f) == cfg


def test_old_names_apply_with_one_note_naming_the_new_key_once(tmp_path, capsys, fresh_notes):
    want = load_config(None, {"rollout": VLLM})
    capsys.readouterr()
    f = tmp_path / "old.yaml"
    f.write_text("rollout:\n  engine: vllm\n  vllm_dtype: bfloat16\n  vllm_memory: 0.5\n")
    assert load_config(f) == want
    assert capsys.readouterr().err.splitlines() == [
        "note: rollout.vllm_dtype is now rollout.vllm.dtype",
        "note: rollout.vllm_memory is now rollout.vllm.memory",
    ]
    old = ["--rollout.engine=vllm", "--rollout.vllm_dtype=bfloat16", "--rollout.vllm_memory=0.5"]
    assert load_config(None, old) == want
    api = {"rollout.engine": "vllm", "rollout.vllm_dtype": "bfloat16", "rollout.vllm_memory": 0.5}
    assert load_config(None, overrides(api)) == want
    assert capsys.readouterr().err == ""  # noted once a process


def test_data_preset_is_read_as_data_format_with_one_note(tmp_path, capsys, fresh_notes):
    """The dataset's file format is `data.format` (a preset is an algorithm recipe); the old
    key works from a YAML file, the command line, the Python API and a stored config.yaml."""
    want = load_config(None, ["--data.format=gsm8k"])
    assert want.data.format == "gsm8k" and "format: gsm8k" in dump_yaml(want)
    assert capsys.readouterr().err == ""
    f = tmp_path / "old.yaml"
    f.write_text("data:\n  preset: gsm8k\n")
    assert load_config(f) == want
    assert capsys.readouterr().err.splitlines() == ["note: data.preset is now data.format"]
    assert load_config(None, ["--data.preset=gsm8k"]) == want
    assert load_config(None, overrides({"data.preset": "gsm8k"})) == want
    assert capsys.readouterr().err == ""  # noted once a process
    assert flat_keys("data", {"preset": "gsm8k"}) == {"format": "gsm8k"}


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"vllm.dtyp": "x"}, r"unknown key rollout\.vllm\.dtyp; did you mean rollout\.vllm\.dtype\?; "
                             r"valid keys of rollout\.vllm: dtype, memory, mode, urls, launch, cpus, gpus, timeout$"),
        ({"vllm": {"memry": 0.5}}, r"unknown key rollout\.vllm\.memry; did you mean rollout\.vllm\.memory\?"),
        ({"vllm": "bfloat16"}, r"rollout\.vllm: got 'bfloat16', expected a mapping of its keys \(dtype, memory, mode, urls, launch, cpus, gpus, timeout\)$"),
        ({"tools.x": 1}, r"unknown key rollout\.tools\.x"),
        ({"vllm.dtype": "int8"}, r"rollout\.vllm\.dtype: got 'int8', expected one of 'auto', "),
        ({"vllm_dtype": "float32"}, r"^rollout\.vllm\.dtype: got 'float32', expected auto unless rollout\.engine is vllm"),
        ({"engine": "vllm", "vllm": {"memory": 1.5}}, r"^rollout\.vllm\.memory: got 1\.5, expected in \(0, 1\)$"),
    ],
)  # fmt: skip
def test_bad_keys_of_the_section_fail_by_name(changes, match, fresh_notes):
    with pytest.raises(ConfigError, match=match) as e:
        load_config(None, {"rollout": changes})
    assert "\n" not in str(e.value)


def test_help_lists_the_sections_keys_documented():
    cfg = load_config(None, {"rollout": VLLM})
    lines = [line for line in help_text(cfg).splitlines() if "--rollout.vllm" in line]
    assert [line.split("=")[0] for line in lines] == [
        "  --rollout.vllm.dtype",
        "  --rollout.vllm.memory",
        "  --rollout.vllm.mode",
        "  --rollout.vllm.urls",
        "  --rollout.vllm.launch",
        "  --rollout.vllm.cpus",
        "  --rollout.vllm.gpus",
        "  --rollout.vllm.timeout",
    ]
    assert "vLLM's gpu_memory_utilization). [schema default 0.35]" in lines[1]


def test_flat_keys_spell_the_section_out_and_read_old_names():
    section = to_dict(load_config(None, {"rollout": VLLM}))["rollout"]
    flat = flat_keys("rollout", section)
    assert flat["vllm.dtype"] == "bfloat16" and flat["vllm.memory"] == 0.5 and "vllm" not in flat
    assert flat_keys("rollout", {"vllm_dtype": "auto", "vllm_memory": 0.35}) == {
        "vllm.dtype": "auto",
        "vllm.memory": 0.35,
    }
    params = {"params": {"math": {"signed": False}}}  # a mapping value, not a section
    assert flat_keys("reward", params) == params


def test_resume_compares_the_section_key_by_key_and_reads_old_records():
    cfg = load_config(None, {"rollout": VLLM})
    record = to_dict(cfg)
    old = dict(record["rollout"])
    del old["vllm"]
    old.update(vllm_dtype="bfloat16", vllm_memory=0.5)  # what an older checkpoint holds
    assert config_differences({**record, "rollout": old}, to_dict(cfg)) == []
    moved = load_config(None, {"rollout": {**VLLM, "vllm": {"dtype": "bfloat16", "memory": 0.4}}})
    assert config_differences(record, to_dict(moved)) == ["rollout.vllm.memory (0.5 -> 0.4)"]
    with pytest.raises(ConfigError, match=r"resume: cannot change rollout\.vllm\.memory \("):
        check_resume_changes(cfg, moved)


def test_a_record_older_than_a_key_differs_only_where_the_key_leaves_its_default():
    record = to_dict(load_config(None, {}))
    del record["train"]["max_staleness"]  # a checkpoint saved before the key existed
    assert config_differences(record, to_dict(load_config(None, {}))) == []
    stale = load_config(None, {"train": {"max_staleness": 1}, "algo": {"rollout_bypass": True}})
    assert "train.max_staleness (absent -> 1)" in config_differences(record, to_dict(stale))


def test_trl_vllm_memory_lands_in_the_section():
    got = trl_changes({"use_vllm": True, "vllm_gpu_memory_utilization": 0.5})
    assert got.changes["rollout"] == {"engine": "vllm", "vllm.memory": 0.5}
    assert load_config(None, got.changes).rollout.vllm.memory == 0.5
