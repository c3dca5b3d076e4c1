"""Models from the Hub without a network, and mis-matched model objects: an unreachable Hub is
found with one short probe (one line, no retries), a cached model still loads, a model object
built in memory is refused by name without a Hub lookup, and only token ids the model cannot
embed are a vocabulary error."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

import rlvr
from rlvr.config.schema import ConfigError
from rlvr.models import build_tiny_model, build_tokenizer
from test_api import exact_answer, rows

UNREACHABLE = "http://127.0.0.1:9"  # the discard port: nothing listens, refused at once

LOAD = """
import json, sys, time
from rlvr.models import load_model
import huggingface_hub, transformers.models.auto  # imported before the clock starts
t = time.time()
try:
    model = load_model(sys.argv[1])
    print(json.dumps({"loaded": type(model).__name__, "s": time.time() - t}))
except FileNotFoundError as e:
    print(json.dumps({"error": str(e), "s": time.time() - t}))
"""


def _load_in_child(name: str, **extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "HF_HUB_OFFLINE"}
    env.update(HF_ENDPOINT=UNREACHABLE, **extra)
    out = subprocess.run([sys.executable, "-c", LOAD, name], capture_output=True, text=True,
                         env=env, timeout=300)  # fmt: skip
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("offline", [False, True])
def test_an_unreachable_hub_fails_fast_in_one_line(offline, tmp_path):
    env = {"HF_HUB_CACHE": str(tmp_path / "cache")}
    if offline:
        env["HF_HUB_OFFLINE"] = "1"
    got = _load_in_child("someorg/no-such-model", **env)
    assert "\n" not in got["error"]
    assert got["error"].startswith("could not load 'someorg/no-such-model': it is not a local")
    assert ("HF_HUB_OFFLINE is set" if offline else f"{UNREACHABLE}: ConnectError") in got["error"]
    assert got["s"] < 15  # one probe (3 s at most), not transformers' retries (~47 s)


def test_a_cached_hub_model_loads_without_the_hub(tmp_path, tiny_model_dir):
    snapshot = tmp_path / "cache" / "models--someorg--tiny" / "snapshots" / ("a" * 40)
    snapshot.mkdir(parents=True)
    for f in tiny_model_dir.iterdir():
        (snapshot / f.name).write_bytes(f.read_bytes())
    (tmp_path / "cache" / "models--someorg--tiny" / "refs").mkdir()
    (tmp_path / "cache" / "models--someorg--tiny" / "refs" / "main").write_text("a" * 40)
    got = _load_in_child("someorg/tiny", HF_HUB_CACHE=str(tmp_path / "cache"))
    assert got.get("loaded") == "LlamaForCausalLM", got


def test_a_model_object_built_in_memory_needs_its_tokenizer_by_name(tmp_path):
    model = build_tiny_model(build_tokenizer(), seed=0, hidden_size=16, num_layers=1,
                             num_heads=2, num_kv_heads=1, intermediate_size=32)  # fmt: skip
    t = time.time()
    with pytest.raises(ConfigError, match=r"^tokenizer: the LlamaForCausalLM object was built "
                                          r"in memory .*; pass tokenizer=$"):  # fmt: skip
        rlvr.train(model=model, reward_funcs=[exact_answer], train_dataset=rows(4, 0),
                   output_dir=tmp_path / "run", show_progress=False)  # fmt: skip
    assert time.time() - t < 10  # no Hub lookup of "LlamaForCausalLM"
    assert not (tmp_path / "run").exists()


def test_a_loaded_model_object_finds_its_tokenizer_from_its_config(tmp_path, tiny_model_dir):
    from rlvr.api.model_object import tokenizer_of as _tokenizer_of
    from rlvr.models import load_model

    tokenizer = _tokenizer_of(load_model(str(tiny_model_dir)))
    assert len(tokenizer) == len(build_tokenizer())


def test_only_ids_the_model_cannot_embed_are_a_vocabulary_error():
    from rlvr.models import check_vocabulary

    tok = build_tokenizer()  # 108 ids
    model = build_tiny_model(tok, seed=0, hidden_size=16, num_layers=1, num_heads=2,
                             num_kv_heads=1, intermediate_size=32)  # fmt: skip
    check_vocabulary(tok, model, "m")
    model.resize_token_embeddings(128)  # padded rows, as Qwen2's 151,936 for 151,665 ids
    check_vocabulary(tok, model, "m")
    model.resize_token_embeddings(len(tok) - 3)
    with pytest.raises(ValueError) as info:
        check_vocabulary(tok, model, "m")
    assert str(info.value).startswith(
        "m: the tokenizer makes 108 token ids but the model embeds only 105 (ids 105..107 have "
        "no embedding)"
    )


def test_a_tokenizer_larger_than_the_model_is_one_config_error(tmp_path):
    tok = build_tokenizer()
    model = build_tiny_model(tok, seed=0, hidden_size=16, num_layers=1, num_heads=2,
                             num_kv_heads=1, intermediate_size=32)  # fmt: skip
    tok.add_tokens(["<extra_0>", "<extra_1>"])
    with pytest.raises(ConfigError, match=r"tokenizer makes 110 token ids but the model embeds"):
        rlvr.train(model=model, tokenizer=tok, reward_funcs=[exact_answer],
                   train_dataset=rows(4, 0), output_dir=tmp_path / "run",
                   show_progress=False)  # fmt: skip
    assert not (tmp_path / "run").exists()
