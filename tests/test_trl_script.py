"""A TRL GRPO script of the usual kind, run by rlvr with only the import and the trainer call
changed: a Qwen2 built in memory with Qwen2's 151,936-token vocabulary and a BPE tokenizer
trained here by `tokenizers`, GSM8K-style rows, two TRL-signature rewards with the format
reward listed first, `peft.LoraConfig`, a cosine schedule with a warm-up ratio and a
`transformers.TrainerCallback`. The run is then evaluated, merged and resumed from the CLI."""

import json
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import rlvr

peft = pytest.importorskip("peft")

REWARDS = """
import re


def format_reward(completions, **kwargs):
    return [1.0 if re.search(r"<answer>.*</answer>", c[0]["content"]) else 0.0
            for c in completions]


def correctness_reward(completions, answer, **kwargs):
    return [1.0 if a in c[0]["content"] else 0.0 for c, a in zip(completions, answer)]
"""


def bpe_tokenizer(texts):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from rlvr.models import CHAT_TEMPLATE

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())  # fmt: skip
    tok.train_from_iterator(texts, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>",
                                   pad_token="<|endoftext|>", chat_template=CHAT_TEMPLATE)  # fmt: skip


def gsm8k_rows(n):
    return [{"prompt": [{"role": "user", "content": f"Tom has {a} apples and buys {b} more. "
                         "How many now? Answer in <answer></answer>."}],
             "answer": str((a + b) % 10)} for a, b in zip(range(n), range(3, n + 3))]  # fmt: skip


@pytest.mark.slow  # about 25 s: a training run and three CLI commands
def test_a_trl_script_runs_and_its_run_evaluates_merges_and_resumes(tmp_path, monkeypatch):
    from transformers import Qwen2Config, Qwen2ForCausalLM, TrainerCallback

    (tmp_path / "my_rewards.py").write_text(textwrap.dedent(REWARDS))
    monkeypatch.syspath_prepend(str(tmp_path))
    from my_rewards import correctness_reward, format_reward

    rows = gsm8k_rows(40)
    tok = bpe_tokenizer([r["prompt"][0]["content"] for r in rows] + ["<answer>7</answer>"] * 20)
    import torch

    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(
        vocab_size=151936, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, intermediate_size=32, max_position_embeddings=256,
        tie_word_embeddings=True, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
    ))  # fmt: skip

    logged = []

    class Logged(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            logged.append(dict(logs))

    run = tmp_path / "run"
    trainer = rlvr.Trainer(  # TRL: GRPOTrainer(
        model=model,
        processing_class=tok,
        reward_funcs=[format_reward, correctness_reward],
        args={"output_dir": str(run), "learning_rate": 1e-2, "lr_scheduler_type": "cosine",
              "warmup_ratio": 0.25, "num_generations": 4, "per_device_train_batch_size": 8,
              "max_completion_length": 16, "max_steps": 4, "save_steps": 2, "beta": 0.0},
        train_dataset=rows,
        peft_config=peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                                    task_type="CAUSAL_LM"),
        callbacks=[Logged()],
        config={"train.eval_size": 0, "algo.dynamic_sampling": False},
        show_progress=False,
    )  # fmt: skip
    result = trainer.train()
    assert isinstance(result.model, peft.PeftModel)
    base = run / "base_model"
    adapter = json.loads((run / "checkpoints/step-000004/adapter_config.json").read_text())
    assert adapter["base_model_name_or_path"] == str(base)
    stored = (run / "config.yaml").read_text()
    assert f"name_or_path: {base}" in stored and "accuracy: my_rewards:correctness_reward" in stored
    m = result.metrics
    assert {"rewards/format_reward/mean", "rewards/correctness_reward/mean"} <= set(m[0])
    # TRL's cosine over 4 steps, warm-up ceil(0.25 x 4) = 1, as TRL counts; `lr` is logged
    # after the step: 1e-2 x 0.5 (1 + cos(pi (k - 1) / 3)) for k = 1..4
    want = [1e-2 * 0.5 * (1 + math.cos(math.pi * (k - 1) / 3)) for k in range(1, 5)]
    assert [r["lr"] for r in m] == pytest.approx(want, abs=1e-12)  # float64 of the same terms
    assert len(logged) == 4 and all("rewards/format_reward/mean" in x for x in logged)

    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(rlvr.__file__).parents[1]),
                                                          str(tmp_path)])}  # fmt: skip
    merged = tmp_path / "merged"
    for cmd in (
        ["eval", "--model", str(run), "--num-prompts", "2", "--k", "1", "--trust-run-code"],
        ["export", str(run), "--merge", "--output", str(merged)],
        ["train", "--resume", str(run), "--max-steps", "5", "--no-progress", "--trust-run-code"],
    ):
        out = subprocess.run([sys.executable, "-m", "rlvr", *cmd], cwd=tmp_path, env=env,
                             capture_output=True, text=True, timeout=600)  # fmt: skip
        assert out.returncode == 0, (cmd[0], out.stderr[-2000:])
    assert (merged / "config.json").is_file()
    steps = [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4, 5]
