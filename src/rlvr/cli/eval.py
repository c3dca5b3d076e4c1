"""`rlvr eval`: avg@k, pass@k and greedy accuracy of a model, a run, or a checkpoint.

What is evaluated: a model directory, a Hub id or "rlvr-tiny"; a run directory (its newest
good checkpoint, scored on the run's own data and rewards unless told otherwise); or a
checkpoint, a LoRA adapter included (its base is loaded and the adapter merged). Against
what: a built-in task (`--task`), or any dataset and reward config with the training keys
(`--data.path=... --data.format=gsm8k --reward.accuracy=math ...`); a dataset's held-out
file (`data.eval_path`) is used when set, else `data.path`. `--output FILE.jsonl` writes one
line per answer (prompt, completion, answer, reward, correct, length; greedy or sampled);
`--pass-k 1,10` adds the unbiased pass@k (`rlvr.algos.passk`) and `--per-problem FILE.jsonl` each
problem's. `--samples FILE.jsonl` scores completions made elsewhere instead of a model
(`rlvr.cli.eval_samples`).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from rlvr.config.load import load_config, parse_overrides
from rlvr.config.schema import Config, ConfigError
from rlvr.run.stored_config import check_run_code, code_overrides

SUMMARY = "avg@k, pass@k, greedy accuracy of a model, run or checkpoint on a task or dataset"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="rlvr eval",
        description="avg@k, pass@k and greedy accuracy of a model, a run directory or a "
        "(LoRA) checkpoint, on a built-in task or a dataset (--data.*, --reward.* as in "
        "training)",
    )
    p.add_argument(
        "--model",
        help="model directory, hub id, rlvr-tiny, run dir or checkpoint (required "
        "unless --samples)",
    )
    p.add_argument(
        "--samples",
        help="score these completions (jsonl: completion + task_id or "
        "prompt_index) instead of sampling a model (rlvr.cli.eval_samples)",
    )
    p.add_argument(
        "--partial",
        action="store_true",
        help="--samples: score a file that answers only some of the dataset's problems (the "
        "report says 'k of N problems'); without it such a file is refused",
    )
    p.add_argument("--pass-k", default="1,10,100", help="k values of the unbiased pass@k")
    p.add_argument("--per-problem", help="write n, correct and pass@k per problem (jsonl)")
    p.add_argument("--task", help="built-in task name (default: the run's data, else arithmetic)")
    p.add_argument("--k", type=int, default=4, help="sampled answers per prompt")
    p.add_argument("--num-prompts", type=int, default=256, help="held-out prompts (at most)")
    p.add_argument("--max-new-tokens", type=int, default=None)
    p.add_argument("--temperature", type=float, default=None)
    p.add_argument("--output", help="write every answer to this jsonl file")
    p.add_argument(
        "--trust-run-code",
        action="store_true",
        help="import the rewards and tools (module:function, file.py:function) a run "
        "directory's config.yaml names without naming them again",
    )
    return p


def resolve_target(name: str) -> tuple[str, Path | None]:
    """(model or checkpoint to load, run directory whose config applies, if any)."""
    from rlvr.run.checkpoint import latest_good_checkpoint, verify_checkpoint

    path = Path(name).expanduser()
    if (path / "config.yaml").is_file() and (path / "checkpoints").is_dir():
        checkpoint = latest_good_checkpoint(path)
        if checkpoint is None:
            raise ConfigError(f"--model: {path} holds no intact checkpoint to evaluate")
        return str(checkpoint), path
    if (path / "manifest.json").is_file():  # a checkpoint of a run
        verify_checkpoint(path)
        run = path.parent.parent
        return str(path), run if (run / "config.yaml").is_file() else None
    return name, None


def _config(args, overrides: dict, run_dir: Path | None, model: str) -> Config:
    base = run_dir / "config.yaml" if run_dir is not None else None
    changes = {k: dict(v) for k, v in overrides.items()}
    if args.task:
        changes.setdefault("data", {}).update(task=args.task, path=None, eval_path=None)
    changes.setdefault("model", {})["name_or_path"] = model
    # evaluation samples with rlvr's own rollouts: neither agent nor environment is imported
    changes.setdefault("env", {}).update(agent=None, environment=None)
    train = changes.setdefault("train", {})
    train.update(eval_size=args.num_prompts, eval_samples=args.k, output_dir=None)
    rollout = changes.setdefault("rollout", {})
    if args.temperature is not None:
        rollout["temperature"] = args.temperature
    if args.max_new_tokens:
        rollout["max_new_tokens"] = args.max_new_tokens
    cfg = load_config(base, changes)
    if _vllm_missing(cfg, overrides):
        sys.stderr.write(
            f"note: {run_dir} trained with rollout.engine=vllm, which is not installed here: "
            "evaluating with rollout.engine=fast (--rollout.engine chooses another)\n"
        )
        rollout.update({"engine": "fast", "vllm.dtype": "auto"})
        cfg = load_config(base, changes)
    if cfg.data.path is not None and cfg.data.eval_path is None:  # score the dataset itself
        cfg = load_config(
            base, {**changes, "data": {**changes.get("data", {}), "eval_path": cfg.data.path}}
        )
    if run_dir is not None:  # the run's code is imported only when named again or trusted
        note = check_run_code(
            cfg, code_overrides(overrides), args.trust_run_code, f"--model {run_dir}"
        )
        if note:
            sys.stderr.write(note + "\n")
    return cfg


def _vllm_missing(cfg: Config, overrides: dict) -> bool:
    """A run's stored engine is vllm, vLLM is not importable here, and the command line did
    not name an engine: the run is evaluated with the default engine instead."""
    import importlib.util

    named = "engine" in overrides.get("rollout", {})
    return cfg.rollout.engine == "vllm" and not named and importlib.util.find_spec("vllm") is None


def load_for_eval(target: str, dtype: str = "float32"):
    """(model, tokenizer) for a model, a checkpoint, or a LoRA checkpoint (merged)."""
    from rlvr.models import load_model, load_tokenizer

    adapter = Path(target) / "adapter_config.json"
    if adapter.is_file():
        import peft

        base = json.loads(adapter.read_text())["base_model_name_or_path"]
        model = peft.PeftModel.from_pretrained(load_model(base, dtype=dtype), target)
        return model.merge_and_unload().eval(), load_tokenizer(target)
    return load_model(target, dtype=dtype).eval(), load_tokenizer(target)


def eval_site(cfg: Config, model, source, toolbox=None):
    """Where `rlvr eval`'s engine runs: the model's device, the tools, the run's longest
    sequence and a step's rows (prompts x G), as training sizes them."""
    from rlvr.rollout import EngineSite, longest_sequence

    r = cfg.rollout
    return EngineSite(
        tools=toolbox,
        max_model_len=longest_sequence(cfg, model, source),
        max_rows=r.prompts_per_step * r.group_size,
    )


def run(argv: list[str]) -> int:
    from rlvr.cli.arguments import split_overrides

    over_argv, rest = split_overrides(argv)
    args, unknown = _parser().parse_known_args(rest)
    # imported once the arguments parse: `rlvr eval --help` needs neither torch nor a model
    from rlvr.cli.eval_samples import eval_samples, model_passk
    from rlvr.data.prompts import dropped_note, load_prompts
    from rlvr.rewards.scoring import Scorer
    from rlvr.rollout import build_engine
    from rlvr.training.evaluation import evaluate
    from rlvr.training.overlap import Generator
    from rlvr.training.settings import eval_params
    from rlvr.training.setup import Given, build_toolbox

    if args.partial and not args.samples:
        raise ConfigError("--partial: applies to --samples (a file of completions) only")
    if args.samples:
        cfg = _config(args, parse_overrides(over_argv + unknown), None, "rlvr-tiny")
        print(json.dumps(eval_samples(cfg, args), indent=2))
        return 0
    if args.model is None:
        raise ConfigError("--model: required (or --samples FILE.jsonl to score given completions)")
    target, run_dir = resolve_target(args.model)
    cfg = _config(args, parse_overrides(over_argv + unknown), run_dir, target)
    model, tokenizer = load_for_eval(target, cfg.model.dtype)
    source = load_prompts(cfg, tokenizer, getattr(model.config, "max_position_embeddings", None))
    if dropped_note(source):
        print(dropped_note(source), file=sys.stderr)
    if not source.eval:
        raise ConfigError("no held-out prompts: set --num-prompts > 0 or --data.eval_path")
    scorer = Scorer.build(cfg, source.task, has_answer=source.has_answer)
    toolbox = build_toolbox(cfg, source, tokenizer, Given())  # rollout.tools, or the task's
    engine = build_engine(cfg, model, tokenizer, eval_site(cfg, model, source, toolbox))
    sampled_rows: list[dict] = []
    greedy_rows: list[dict] = []
    gen = Generator(engine, tokenizer, scorer)
    try:
        sampled = evaluate(gen, source.eval, params=eval_params(cfg), records=sampled_rows)
        greedy = evaluate(
            gen, source.eval, params=eval_params(cfg, greedy=True, n=1), records=greedy_rows
        )
    finally:
        engine.close()  # what it started (launched vLLM servers) ends with the evaluation
    result = {
        "model": target,
        "data": cfg.data.eval_path or source.name,
        f"avg@{args.k}": sampled["accuracy"],
        f"pass@{args.k}": sampled["pass_at_k"],
        "greedy_accuracy": greedy["accuracy"],
        "num_prompts": sampled["num_prompts"],
        "mean_length": sampled["mean_length"],
        "truncation_rate": sampled["truncation_rate"],
        **{k: sampled[k] for k in ("tool_calls_per_sample", "tool_call_frac") if k in sampled},
        **model_passk(args, sampled_rows, source.eval),  # pass@k for k < --k too
    }
    if args.output:
        out = Path(args.output)
        out.parent.mkdir(parents=True, exist_ok=True)
        with out.open("w", encoding="utf-8") as f:
            for kind, records in (("greedy", greedy_rows), ("sampled", sampled_rows)):
                for r in records:
                    f.write(json.dumps({"mode": kind, **r}, ensure_ascii=False) + "\n")
        result["output"] = str(out)
    print(json.dumps(result, indent=2))
    return 0
