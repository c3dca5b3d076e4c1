"""Shared fixtures: a tiny randomly initialised Qwen2 and its tokenizer, saved with
save_pretrained to a local directory, exactly as a user's model would be."""

import pytest
import torch

from rlvr.models import build_tiny_model, build_tokenizer

torch.set_num_threads(2)


@pytest.fixture(scope="session")
def tokenizer():
    return build_tokenizer()


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, tokenizer):
    path = tmp_path_factory.mktemp("tiny-qwen2")
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
