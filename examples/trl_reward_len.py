"""TRL's GRPO quickstart (`reward_len`) ported to rlvr: the import and the trainer construction
change, the reward function and the data's shape do not.

    python examples/trl_reward_len.py            # 12 steps on the built-in tiny model
    python examples/trl_reward_len.py 4          # a shorter run

The TRL script (TRL's GRPOTrainer documentation):

    from datasets import load_dataset
    from trl import GRPOConfig, GRPOTrainer

    dataset = load_dataset("trl-lib/tldr", split="train")

    def reward_len(completions, **kwargs):
        return [-abs(20 - len(completion)) for completion in completions]

    training_args = GRPOConfig(output_dir="Qwen2-0.5B-GRPO")
    trainer = GRPOTrainer(
        model="Qwen/Qwen2-0.5B-Instruct",
        reward_funcs=reward_len,
        args=training_args,
        train_dataset=dataset,
    )
    trainer.train()

Here the dataset is prompt-only rows made locally (nothing is downloaded), the model is the
built-in one, and `args` holds GRPOConfig's own field names as a mapping (only those given
are applied; a `trl.GRPOConfig` object is accepted too where trl is installed). The `grpo`
preset is TRL's loop: no dynamic sampling; `beta` 0 as TRL's default. Under rlvr's default
`dapo` preset this reward trains too: its name does not say correctness, so dynamic sampling
keeps the groups whose rewards differ (docs/algorithms.md#dynamic-sampling).
"""

import random
import sys

import rlvr  # TRL: from trl import GRPOConfig, GRPOTrainer


def make_dataset(n, seed=0):
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        a, b = rng.randint(10, 99), rng.randint(10, 99)
        rows.append({"prompt": f"Compute {a}+{b}. Answer in <answer></answer>."})
    return rows


dataset = make_dataset(1000)


def reward_len(completions, **kwargs):
    return [-abs(20 - len(completion)) for completion in completions]


steps = int(sys.argv[1]) if len(sys.argv) > 1 else 12
trainer = rlvr.Trainer(  # TRL: GRPOTrainer(
    model="rlvr-tiny",
    reward_funcs=reward_len,
    args={
        "output_dir": "runs/trl-reward-len",
        "learning_rate": 4e-4,
        "num_generations": 8,
        "per_device_train_batch_size": 64,  # completions: 8 prompts x 8 generations
        "max_completion_length": 32,
        "max_steps": steps,
        "beta": 0.0,
    },
    train_dataset=dataset,
    preset="grpo",
)
result = trainer.train()

rewards = [m["reward/mean"] for m in result.metrics]
first, last = sum(rewards[:5]) / len(rewards[:5]), sum(rewards[-5:]) / len(rewards[-5:])
print(f"reward_len: mean of the first 5 steps {first:.2f}, of the last 5 steps {last:.2f}")
