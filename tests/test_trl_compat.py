"""TRL's GRPOConfig names as rlvr config (rlvr.api.trl): batch units, step units, what is
refused and why, aliases in `config=` and on the command line, did-you-mean for near misses,
and a peft.LoraConfig as model.lora_* keys. Plain mappings need no trl; the GRPOConfig object
tests skip without it."""

from __future__ import annotations

import pytest

from rlvr.api.inputs import overrides
from rlvr.api.trl import peft_changes, trl_changes
from rlvr.config.load import load_config
from rlvr.config.schema import ConfigError


def test_only_the_keys_given_are_applied():
    got = trl_changes({"learning_rate": 1e-5, "beta": 0.04, "max_completion_length": 64})
    assert got.changes == {
        "optim": {"lr": 1e-5},
        "algo": {"kl_coef": 0.04},
        "rollout": {"max_new_tokens": 64},
    }
    assert got.notes == [] and got.logging_steps == 1


def test_batch_units_completions_to_prompts_exactly():
    # TRL: per_device_train_batch_size counts completions; one optimiser step takes
    # 8 completions x 2 accumulation steps x 2 ranks = 32 completions = 32 / 4 = 8 prompts
    got = trl_changes(
        {"per_device_train_batch_size": 8, "gradient_accumulation_steps": 2,
         "num_generations": 4},
        world_size=2,
    )  # fmt: skip
    assert got.changes["rollout"] == {"group_size": 4, "prompts_per_step": 8}
    assert got.changes["algo"] == {"mini_batches": 1}  # steps_per_generation = accumulation
    assert got.changes["optim"] == {"micro_batch_sequences": 8}
    # steps_per_generation 4 over 2 accumulation steps: one rollout of 8 x 1 x 4 / 4 = 8
    # prompts feeds 4 / 2 = 2 optimiser steps; TRL's max_steps 12 with num_iterations 3 is
    # 12 / (3 x 2) = 2 rollout steps, save_steps 6 is every 1
    got = trl_changes(
        {"per_device_train_batch_size": 8, "gradient_accumulation_steps": 2,
         "steps_per_generation": 4, "num_generations": 4, "num_iterations": 3,
         "max_steps": 12, "save_steps": 6},
    )  # fmt: skip
    assert got.changes["rollout"]["prompts_per_step"] == 8
    assert got.changes["algo"] == {"mini_batches": 2, "mu": 3}
    assert got.changes["train"] == {"max_steps": 2, "save_every": 1}
    # generation_batch_size 48 = 48 / 8 = 6 steps per generation -> 48 / 4 = 12 prompts
    got = trl_changes(
        {"per_device_train_batch_size": 8, "generation_batch_size": 48, "num_generations": 4}
    )
    assert got.changes["rollout"]["prompts_per_step"] == 12
    assert got.changes["algo"] == {"mini_batches": 6}
    cfg = load_config(None, got.changes)  # the result is a valid config
    assert cfg.rollout.prompts_per_step * cfg.rollout.group_size == 48


@pytest.mark.parametrize(
    ("args", "match"),
    [
        ({"per_device_train_batch_size": 8, "num_generations": 3},
         r"prompts per step\) is not a whole number \(8 / 3\)"),
        ({"per_device_train_batch_size": 8}, "give num_generations with them"),
        ({"num_iterations": 2, "max_steps": 5}, r"max_steps / .* \(5 / 2\)"),
        ({"top_entropy_quantile": 0.2}, "top_entropy_quantile=0.2: rlvr's algo.top_entropy_q"),
        ({"lr_scheduler_type": "inverse_sqrt"}, "lr_scheduler_type='inverse_sqrt': rlvr has"),
        ({"lr_scheduler_kwargs": {"power": 2.0}}, r"lr_scheduler_kwargs \['power'\]"),
        ({"loss_type": "bnpo"}, "bnpo normalises per micro-batch"),
        ({"loss_type": "cispo"}, "loss_type='cispo': rlvr has grpo, dapo, dr_grpo"),
        ({"scale_rewards": "batch"}, "scale_rewards='batch'"),
        ({"fp16": True}, "fp16=True: rlvr trains in fp32"),
        ({"learnig_rate": 1e-5}, "did you mean learning_rate"),
        ({"num_generation": 4}, "did you mean num_generations"),
        ({"report_to": ["comet_ml"]}, "report_to="),
        ({"use_vllm": True, "vllm_mode": "server"}, "colocated only"),
    ],
)  # fmt: skip
def test_refused_by_name_with_the_reason(args, match):
    with pytest.raises(ConfigError, match=match) as e:
        trl_changes(args)
    assert "\n" not in str(e.value)


def test_trl_algorithm_names():
    got = trl_changes(
        {"loss_type": "dr_grpo", "scale_rewards": "none", "epsilon": 0.1, "delta": 2.0,
         "mask_truncated_completions": True, "importance_sampling_level": "sequence",
         "sync_ref_model": True, "ref_model_sync_steps": 8, "ref_model_mixup_alpha": 0.5}
    )  # fmt: skip
    algo = got.changes["algo"]
    assert algo == {
        "agg": "token_sum_norm", "advantage": "dr_grpo", "clip_low": 0.1,
        "clip_high": 0.1,  # TRL: epsilon_high defaults to epsilon
        "dual_clip": 2.0, "overlong_filter": True, "ratio": "sequence",
        "ref_sync_every": 8, "ref_mixup_alpha": 0.5,
    }  # fmt: skip
    assert trl_changes({"epsilon": 0.2, "epsilon_high": 0.28}).changes["algo"] == {
        "clip_low": 0.2, "clip_high": 0.28}  # fmt: skip


def test_epochs_need_the_row_count():
    # 1000 rows // 8 prompts per step = 125 steps per epoch; 2 epochs = 250 rollout steps
    args = {"num_train_epochs": 2, "per_device_train_batch_size": 32, "num_generations": 4}
    assert trl_changes(args, num_rows=1000).changes["train"]["max_steps"] == 250
    with pytest.raises(ConfigError, match="set max_steps"):
        trl_changes(args)


def test_trl_names_as_aliases_in_config_and_on_the_command_line(capsys):
    cfg = load_config(None, ["--learning_rate=1e-5", "--num_generations=4"])
    assert cfg.optim.lr == 1e-5 and cfg.rollout.group_size == 4
    err = capsys.readouterr().err
    assert "note: learning_rate is TRL's name for optim.lr" in err
    assert "note: num_generations is TRL's name for rollout.group_size" in err
    assert overrides({"max_completion_length": 16}) == {"rollout": {"max_new_tokens": 16}}
    assert "max_new_tokens" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "match"),
    [
        (["--optim.lrr=1"], r"unknown key optim\.lrr; did you mean optim\.lr\?"),
        (["--train.group_size=2"], r"did you mean rollout\.group_size\?"),
        (["--optim.learning_rate=1"], r"learning_rate is TRL's name for optim\.lr"),
        (["--optm.lr=1"], r"unknown section 'optm'; did you mean optim\?"),
        (["--learnin_rate=1"], r"expected --section\.key=value; did you mean learning_rate\?"),
    ],
)
def test_did_you_mean_where_keys_are_checked(argv, match):
    with pytest.raises(ConfigError, match=match):
        load_config(None, argv)


def test_did_you_mean_for_reward_names_and_params():
    from rlvr.rewards import make_reward

    with pytest.raises(ValueError, match=r"unknown reward 'mth'; did you mean math\?"):
        make_reward("mth")
    with pytest.raises(ValueError, match=r"no parameter 'signd'; did you mean signed\?"):
        make_reward("math", signd=True)


def test_peft_lora_config_as_model_keys():
    peft = pytest.importorskip("peft")
    got = peft_changes(peft.LoraConfig(r=4, lora_alpha=8, target_modules="all-linear"))
    assert got == {"model": {"lora_rank": 4, "lora_alpha": 8.0, "lora_dropout": 0.0,
                             "lora_target_modules": ["all-linear"]}}  # fmt: skip
    got = peft_changes(peft.LoraConfig(r=2, target_modules=["v_proj", "q_proj"]))
    assert got["model"]["lora_target_modules"] == ["q_proj", "v_proj"]
    with pytest.raises(ConfigError, match="peft_config: use_dora=True is not carried"):
        peft_changes(peft.LoraConfig(r=2, target_modules="all-linear", use_dora=True))
    with pytest.raises(ConfigError, match="module names, or all-linear alone"):
        load_config(None, {"model": {"lora_rank": 2, "lora_target_modules": ["all-linear", "q"]}})


def test_a_grpo_config_object_carries_trl_defaults():
    trl = pytest.importorskip("trl")
    args = trl.GRPOConfig(output_dir="out", use_cpu=True, bf16=False, num_generations=4,
                          per_device_train_batch_size=8, max_steps=3)  # fmt: skip
    got = trl_changes(args)
    c = got.changes
    assert c["optim"]["lr"] == 1e-6  # TRL's default, applied as TRL would
    assert c["optim"]["gradient_checkpointing"] is True
    assert c["algo"]["agg"] == "token_mean" and c["algo"]["dynamic_sampling"] is False
    assert c["rollout"] == {"group_size": 4, "max_new_tokens": 512, "temperature": 1.0,
                            "top_p": 1.0, "top_k": 0, "prompts_per_step": 2}  # fmt: skip
    assert c["train"]["max_steps"] == 3 and c["train"]["seed"] == 42
    assert c["optim"]["lr_schedule"] == "linear" and c["optim"]["warmup_from_zero"] is True
    with pytest.raises(ConfigError, match=r"top_entropy_quantile=0\.2: rlvr's algo\.top_entropy_q"):
        trl_changes(trl.GRPOConfig(output_dir="out", use_cpu=True, top_entropy_quantile=0.2))
    cosine = trl_changes(trl.GRPOConfig(output_dir="out", use_cpu=True, lr_scheduler_type="cosine",
                                        warmup_steps=0.1))  # fmt: skip
    assert cosine.changes["optim"]["lr_schedule"] == "cosine"
    assert (cosine.changes["optim"]["warmup_steps"], cosine.changes["optim"]["warmup_ratio"]) == (
        0, 0.1)  # fmt: skip


@pytest.mark.parametrize(
    ("args", "optim"),
    [
        (
            {"lr_scheduler_type": "cosine", "warmup_ratio": 0.1},
            {"lr_schedule": "cosine", "warmup_steps": 0, "warmup_ratio": 0.1},
        ),
        (
            {"warmup_steps": 3, "warmup_ratio": 0.5},  # transformers: warmup_steps wins
            {"warmup_steps": 3, "warmup_ratio": 0.0},
        ),
        (
            {
                "lr_scheduler_type": "cosine_with_min_lr",
                "lr_scheduler_kwargs": {"min_lr_rate": 0.1},
            },
            {"lr_schedule": "cosine_with_min_lr", "min_lr_rate": 0.1},
        ),
    ],
)
def test_trl_schedules_carry_with_trls_count(args, optim):
    got = trl_changes(args).changes["optim"]
    assert {k: got[k] for k in optim} == optim and got["warmup_from_zero"] is True


def test_trl_names_at_the_top_of_a_yaml_file(tmp_path, capsys):
    path = tmp_path / "run.yaml"
    path.write_text("learning_rate: 2.0e-5\nrollout:\n  prompts_per_step: 4\nnum_generations: 2\n")
    cfg = load_config(path)
    assert (cfg.optim.lr, cfg.rollout.prompts_per_step, cfg.rollout.group_size) == (2e-5, 4, 2)
    assert "num_generations is TRL's name for rollout.group_size" in capsys.readouterr().err
