"""The Python API: `rlvr.train(...)` and `rlvr.Trainer`, shaped after TRL's GRPOTrainer.

    result = rlvr.train(model="rlvr-tiny", reward_funcs=[my_reward], train_dataset=rows,
                        config={"train.max_steps": 30})
    result.run_dir, result.summary, result.metrics, result.model

Everything becomes an ordinary run: the arguments are layered onto the config exactly as the
CLI's are (defaults -> preset -> built-in model sizes -> `config` -> these arguments), so the
same validation and named errors apply, and the run directory is the CLI's. In-memory datasets
are written into the run directory (`data/train.jsonl`, `data/eval.jsonl`) and loaded from
there as a file would be, so their rows are checked the same way and the run resumes without
them. Reward functions: the accuracy reward (dynamic sampling and the accuracy metrics read
it: a score above `reward.correct_threshold`, default 0, is correct) is chosen by name
(`rlvr.api.inputs.pick_accuracy`: `reward.accuracy` in `config`, else the first whose name says
correctness, with a note; none: the run has no notion of correctness); all rewards add up to
the total with their weights. A model built in memory is saved to RUN_DIR/base_model
(`rlvr.api.model_object`). A function defined in an importable
module is recorded in config.yaml as "module:function", so `rlvr train --resume` can load it;
one defined in a script is recorded by name and resumes through this API. A module's
directory outside the installed packages is recorded as `reward.python_path`.

TRL's shape is taken as well (docs/from_trl.md): `args=` (a `trl.GRPOConfig` or a mapping of
its names, through rlvr.api.trl), `processing_class=` (the tokenizer), `peft_config=` (a
`peft.LoraConfig`) and `transformers.TrainerCallback` objects in `callbacks`.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlvr.api.inputs import (
    check_rows,
    dataset_path,
    importable,
    overrides,
    python_path,
    reward_changes,
    tool_names,
)
from rlvr.api.model_object import BASE_DIR, final_model, model_source, save_base, tokenizer_of
from rlvr.api.trl import differences, peft_changes, trl_changes
from rlvr.config.load import flat_keys, load_config, to_dict
from rlvr.config.presets import preset_names
from rlvr.config.schema import Config, ConfigError
from rlvr.run.callbacks import check_callbacks
from rlvr.run.stored_config import (
    check_resume_changes,
    resolve_paths,
    stored_config,
)

API_SOURCE = "rlvr.train arguments"


@dataclass(frozen=True)
class TrainResult:
    """run_dir: the run directory; summary: summary.json (empty when a signal stopped the
    run before its end); metrics: metrics.jsonl, one dict per step; model: the trained policy
    (the model object passed in, trained in place, or the final checkpoint loaded)."""

    run_dir: Path
    summary: dict[str, Any]
    metrics: list[dict[str, Any]]
    model: Any


class Trainer:
    """The run `rlvr.train` starts, as an object: build it, then `.train()`.
    Arguments as for `rlvr.train` (see its docstring)."""

    def __init__(
        self,
        model: Any = "rlvr-tiny",
        reward_funcs: Sequence[str | Callable] | str | Callable | None = None,
        reward_weights: Sequence[float] | None = None,
        train_dataset: Any = None,
        eval_dataset: Any = None,
        preset: str = "dapo",
        config: Config | Mapping[str, Any] | None = None,
        callbacks: Sequence[Callable] = (),
        output_dir: str | Path | None = None,
        tokenizer: Any = None,
        *,
        args: Any = None,
        processing_class: Any = None,
        peft_config: Any = None,
        tools: Sequence[str | Callable] = (),
        agent: str | Callable | None = None,
        environment: Any = None,
        show_progress: bool = True,
    ):
        if (
            processing_class is not None
            and tokenizer is not None
            and processing_class is not tokenizer
        ):
            raise ConfigError("processing_class: TRL's name for tokenizer; give one of the two")
        self.model_arg, self.tokenizer = (
            model,
            tokenizer if tokenizer is not None else processing_class,
        )
        self.args, self.peft_config = args, peft_config
        self.tools = list(tools or ())
        self.agent, self.environment = agent, environment
        self.reward_funcs, self.reward_weights = reward_funcs, reward_weights
        self.train_dataset, self.eval_dataset = train_dataset, eval_dataset
        self.preset, self.config_arg = preset, config
        self.callbacks = tuple(callbacks or ())
        check_callbacks(self.callbacks)
        self.output_dir, self.show_progress = output_dir, show_progress
        self.functions: dict[str, Callable] = {}
        self.in_memory = False  # a model object with no name or directory to load again
        self.changes = self._changes()  # checks the arguments before any work
        self.config: Config | None = None

    def _changes(self) -> dict[str, dict[str, Any]]:
        changes = overrides(self.config_arg)
        self.trl = None
        if self.args is not None:  # TRL's GRPOConfig names, on top of the preset and `config`
            rows = self.train_dataset
            countable = hasattr(rows, "__len__") and not isinstance(rows, (str, Path))
            self.trl = trl_changes(
                self.args,
                num_rows=len(rows) if countable else None,
                world_size=int(os.environ.get("WORLD_SIZE", "1")),
            )
            if self.trl.reward_weights is not None:
                if self.reward_weights is not None:
                    raise ConfigError("reward_weights: given both here and in args; give one")
                self.reward_weights = self.trl.reward_weights
            for section, values in self.trl.changes.items():
                changes.setdefault(section, {}).update(values)
            if self.output_dir is None:  # TRL's output_dir, for resume_from_checkpoint=True
                self.output_dir = self.trl.changes.get("train", {}).get("output_dir")
        if self.peft_config is not None:
            changes.setdefault("model", {}).update(peft_changes(self.peft_config)["model"])
        model = self.model_arg
        if isinstance(model, (str, Path)):
            changes.setdefault("model", {})["name_or_path"] = str(model)
        elif model is not None:
            if not hasattr(model, "forward"):
                raise ConfigError(f"model: expected a name, a path or a model, got {model!r}")
            # the record in config.yaml; a model built in memory is saved into the run
            # directory (_build), and that directory recorded
            self.in_memory = not model_source(model)
            section = changes.setdefault("model", {})
            section["name_or_path"] = model_source(model) or type(model).__name__
            section.setdefault("dtype", "auto")  # train the object in its own dtype
        if self.reward_funcs is not None:
            chosen = changes.get("reward", {}).get("accuracy")
            reward, self.functions, note = reward_changes(
                self.reward_funcs, self.reward_weights, chosen
            )
            changes.setdefault("reward", {}).update(reward)
            if note and os.environ.get("RANK", "0") == "0":  # once under torchrun
                print(note, file=sys.stderr)
        elif self.reward_weights is not None:
            raise ConfigError("reward_weights: given without reward_funcs")
        if self.output_dir is not None:
            changes.setdefault("train", {})["output_dir"] = str(self.output_dir)
        self.tool_functions: dict[str, Callable] = {}
        if self.tools:
            names, self.tool_functions = tool_names(self.tools)
            changes.setdefault("rollout", {})["tools"] = names
        self.agent_function = None if isinstance(self.agent, str) else self.agent
        if self.agent is not None:  # config.yaml records it by name where it is importable
            if not (isinstance(self.agent, str) or callable(self.agent)):
                raise ConfigError(
                    f"agent: expected a function or 'module:function', got {self.agent!r}"
                )
            name = self.agent if isinstance(self.agent, str) else importable(self.agent)
            if name is not None:  # a function of a script's __main__ runs unrecorded
                changes.setdefault("env", {})["agent"] = name
        self._environment_changes(changes)
        agents = [self.agent_function] if self.agent_function is not None else []
        roots = python_path([*self.functions.values(), *self.tool_functions.values(), *agents])
        if roots and "python_path" not in changes.get("reward", {}):
            changes.setdefault("reward", {})["python_path"] = roots
        return changes

    def _environment_changes(self, changes: dict) -> None:
        """`environment`: a "KIND:TARGET" string is env.environment (recorded in config.yaml);
        an object is handed to the run as it is. Refused beside an agent or a dataset."""
        env = self.environment
        if env is None:
            return
        for name, value in (("agent", self.agent), ("train_dataset", self.train_dataset)):
            if value is not None:
                raise ConfigError(
                    f"environment: not with {name}= (the environment gives the prompts and "
                    "drives the rollouts); give one of the two"
                )
        if isinstance(env, str):
            changes.setdefault("env", {})["environment"] = env

    def _build(self, resume: Path | None) -> Config:
        from rlvr.run.rundir import check_run_dir, draft_run_dir, new_default_run_dir

        changes = {k: (dict(v) if isinstance(v, dict) else v) for k, v in self.changes.items()}
        preset = changes.pop("preset", None) or self.preset
        in_memory = [
            d for d in (self.train_dataset, self.eval_dataset) if not isinstance(d, (str, Path))
        ]
        if resume is not None:
            run_dir = resume
        elif changes.get("train", {}).get("output_dir"):
            run_dir = Path(changes["train"]["output_dir"])
        else:
            run_dir = new_default_run_dir(Path("runs"))
            draft_run_dir(run_dir, made=True)
            self._draft = run_dir
        changes.setdefault("train", {})["output_dir"] = str(run_dir)
        if self.in_memory:
            changes["model"]["name_or_path"] = str(run_dir / BASE_DIR)
        data = changes.setdefault("data", {})
        taken = resume is None and (run_dir / "metrics.jsonl").exists()
        if taken and any(d is not None for d in in_memory):
            raise ConfigError(
                f"train.output_dir: {run_dir} already holds a run; resume it with "
                f"resume_from_checkpoint=True or choose another output_dir"
            )
        if resume is None:  # what is written from here on goes again if the run fails
            check_run_dir(run_dir)
            draft_run_dir(run_dir)
            self._draft = run_dir
        for stem, ds in (("train", self.train_dataset), ("eval", self.eval_dataset)):
            if ds is not None:
                key = "path" if stem == "train" else "eval_path"
                data[key] = dataset_path(ds, run_dir, stem, resume is not None)
        cfg = resolve_paths(load_config(None, changes, preset=preset, source=API_SOURCE))
        if self.trl is not None and resume is None:
            self._print_trl_block(changes, preset, cfg)
        for stem, ds in (("train", self.train_dataset), ("eval", self.eval_dataset)):
            if ds is not None and not isinstance(ds, (str, Path)):
                check_rows(cfg, stem)
        return cfg

    def _print_trl_block(self, changes: dict, preset: str, cfg: Config) -> None:
        """One block: where TRL's args moved the config away from rlvr's preset (and
        `config`), and which of TRL's defaults were not applied."""
        trl = self.trl.changes
        without = {s: {k: v for k, v in kv.items() if k not in trl.get(s, {})}
                   for s, kv in changes.items() if isinstance(kv, dict)}  # fmt: skip
        base, applied = (
            {s: flat_keys(s, v) for s, v in to_dict(c).items() if isinstance(v, dict)}
            for c in (load_config(None, without, preset=preset), cfg)
        )
        keys = {s: {k: applied[s][k] for k in kv if k != "output_dir"} for s, kv in trl.items()}
        lines = differences(base, keys) + [f"  {note}" for note in self.trl.notes]
        if lines and os.environ.get("RANK", "0") == "0":  # once under torchrun
            head = f"TRL args applied (where they differ from rlvr's {preset} preset):"
            print("\n".join([head, *lines]), file=sys.stderr)

    def train(self, resume_from_checkpoint: bool | str | Path | None = None) -> TrainResult:
        """Run training to the end (or until a callback returns "stop"). With
        `resume_from_checkpoint` (True: `output_dir`; or a run directory) the run continues
        from its newest good checkpoint; only RESUME_SAFE keys may differ from its config.
        `show_progress=False` silences transformers' bars too (loading, saving shards)."""
        from rlvr.models import progress_bars

        with progress_bars(self.show_progress):
            return self._train(resume_from_checkpoint)

    def _train(self, resume_from_checkpoint: bool | str | Path | None) -> TrainResult:
        from rlvr.run.rundir import discard_unstarted

        self._draft = None  # a new run's directory, noted by _build, until its first step
        try:
            return self._run(resume_from_checkpoint)
        except BaseException:  # a run that never logged a step leaves nothing behind
            if self._draft is not None:
                discard_unstarted(self._draft)
            raise

    def _run(self, resume_from_checkpoint: bool | str | Path | None) -> TrainResult:
        from rlvr.training.trainer import Given
        from rlvr.training.trainer import train as run_training

        resume = None
        if resume_from_checkpoint:
            target = self.output_dir if resume_from_checkpoint is True else resume_from_checkpoint
            if target is None:
                raise ConfigError("resume_from_checkpoint=True needs output_dir")
            resume = Path(target).expanduser().resolve()
            stored = stored_config(resume)
        cfg = self._build(resume)
        if resume is not None:
            check_resume_changes(stored, cfg)
        self.config = cfg
        tokenizer = self.tokenizer
        if tokenizer is None and not isinstance(self.model_arg, (str, Path)):
            tokenizer = tokenizer_of(self.model_arg)
        if tokenizer is not None and tokenizer.pad_token is None:
            tokenizer.pad_token = tokenizer.eos_token  # masks come from lengths: pad may be eos
        if self.in_memory:
            save_base(self.model_arg, tokenizer, Path(cfg.train.output_dir))
        given = Given(
            model=None if isinstance(self.model_arg, (str, Path)) else self.model_arg,
            tokenizer=tokenizer,
            reward_functions=self.functions,
            tools=self.tool_functions,
            agent=self.agent_function,
            environment=None if isinstance(self.environment, str) else self.environment,
            callbacks=self.callbacks,
            callback_args=None if isinstance(self.args, Mapping) else self.args,
            logging_steps=self.trl.logging_steps if self.trl is not None else 1,
        )
        run_dir = run_training(
            cfg, resume_dir=resume, show_progress=self.show_progress, given=given
        )
        return self._result(Path(run_dir), given)

    def _result(self, run_dir: Path, given) -> TrainResult:
        summary_path = run_dir / "summary.json"
        summary = json.loads(summary_path.read_text()) if summary_path.exists() else {}
        metrics_path = run_dir / "metrics.jsonl"
        metrics = [
            json.loads(line) for line in metrics_path.read_text().splitlines() if line.strip()
        ]
        return TrainResult(run_dir, summary, metrics, self._final_model(run_dir, given))

    def _final_model(self, run_dir: Path, given):
        return final_model(self.config, run_dir, given.model)


def train(
    model: Any = "rlvr-tiny",
    reward_funcs: Sequence[str | Callable] | str | Callable | None = None,
    reward_weights: Sequence[float] | None = None,
    train_dataset: Any = None,
    eval_dataset: Any = None,
    preset: str = "dapo",
    config: Config | Mapping[str, Any] | None = None,
    callbacks: Sequence[Callable] = (),
    output_dir: str | Path | None = None,
    tokenizer: Any = None,
    *,
    args: Any = None,
    processing_class: Any = None,
    peft_config: Any = None,
    tools: Sequence[str | Callable] = (),
    agent: str | Callable | None = None,
    environment: Any = None,
    resume_from_checkpoint: bool | str | Path | None = None,
    show_progress: bool = True,
) -> TrainResult:
    """Train a policy with GRPO/DAPO and return a `TrainResult`.

    model: "rlvr-tiny", a local directory, a Hub id, or a PreTrainedModel (then pass its
        `tokenizer` unless `model.name_or_path` has one).
    reward_funcs: callables with TRL's signature `fn(prompts, completions, completion_ids,
        **kwargs) -> list[float | None]` and/or reward names ("math", "format", "code",
        "module:function", "file.py:function"). The accuracy reward is chosen by name (see
        the module); None keeps the config's (the built-in task's verifier by default).
    reward_weights: one weight per reward function (default 1.0 each).
    train_dataset / eval_dataset: a list of dicts, a `datasets.Dataset`, or a path (jsonl,
        parquet, a saved dataset); rows hold the prompt ("prompt": a string or chat messages)
        and the reference ("answer") unless `data.prompt_field` / `data.answer_field` say
        otherwise. None: the config's data (the built-in task by default).
    preset: one of PRESET_NAMES (a Config passed as `config` keeps its own).
    config: changes to the config, as {"rollout.group_size": 8}, {"rollout": {...}}, or a
        Config.
    callbacks: functions called as `fn(step, metrics)` after every step (returning "stop"
        ends the run, with the final checkpoint and evaluation) and/or
        `transformers.TrainerCallback` objects (rlvr.run.callbacks: the events, state and
        control that exist here; `control.should_training_stop` ends the run the same way).
    output_dir: the run directory (default runs/<timestamp>).
    tools: functions the model may call inside its responses (type hints and a docstring
        with Args:, as TRL takes them) and/or names ("calc", "python", "module:function");
        docs/tools.md. Empty: the config's (the task's own tools by default).
    agent: a function `fn(client, row) -> reward` (or a coroutine function, or its
        "module:function") that makes each rollout through `client`, an OpenAI client
        pointed at the run's own endpoint; training uses the token ids sampled for its
        requests (docs/environments.md). None: the config's env.agent (rlvr's own rollouts).
    environment: an environment of another framework (a `verifiers.v1` Env, an OpenEnv
        environment, or a "KIND:TARGET" string as env.environment takes it) that gives the
        prompts, drives the rollouts through the run's endpoint and scores them, its named
        reward terms logged as reward/<name> (docs/environments.md). Not with `agent` or
        `train_dataset`. None: the config's env.environment.
    args: TRL's training arguments: a mapping of `GRPOConfig` field names (only those given
        are applied, on top of the preset and `config`) or a `trl.GRPOConfig` (every field,
        TRL's defaults included); rlvr.api.trl and docs/from_trl.md give the mapping.
    processing_class: TRL's name for `tokenizer`.
    peft_config: a `peft.LoraConfig` (r, lora_alpha, lora_dropout, target_modules, "all-linear"
        included), as model.lora_* keys.
    resume_from_checkpoint: True (continue the run in `output_dir`) or a run directory.
    """
    trainer = Trainer(
        model,
        reward_funcs,
        reward_weights,
        train_dataset,
        eval_dataset,
        preset,
        config,
        callbacks,
        output_dir,
        tokenizer,
        args=args,
        processing_class=processing_class,
        peft_config=peft_config,
        tools=tools,
        agent=agent,
        environment=environment,
        show_progress=show_progress,
    )
    return trainer.train(resume_from_checkpoint=resume_from_checkpoint)


# the preset list from the registry, so the docstring cannot fall behind it
train.__doc__ = train.__doc__.replace("PRESET_NAMES", preset_names())
