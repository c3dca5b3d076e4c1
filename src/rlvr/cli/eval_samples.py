"""`rlvr eval --samples FILE.jsonl`: score completions made elsewhere (a model served by
another stack, a baseline's outputs) with the run's rewards, and report pass@k.

The file has one JSON object a line: "completion" (a string), and which problem it answers,
either "task_id" (matched to the dataset's `task_id` column, as HumanEval's own sample files
do) or "prompt_index" (0-based, in the evaluated dataset, as `rlvr eval --output` writes).
Other fields are ignored; `rlvr eval --output` files score as they are (their "greedy" rows
are left out when "sampled" ones are present). A problem may have any number of samples, but
every problem of the dataset needs one: pass@k over the problems a file chose to answer is not
the benchmark's (one right answer to 1 of HumanEval's 164 would read pass@1 1.0), so such a file is
refused unless `--partial` says it is meant, and the report then says "k of N problems".
pass@k is reported for each k that every problem with samples reaches (`rlvr.algos.passk`). The
samples carry text only: rewards see empty `completion_ids`, `completion_lengths` 0 and
`truncated` False.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import torch

from rlvr.algos.passk import pass_at_k
from rlvr.data.errors import DatasetError
from rlvr.data.text import json_lines

CHUNK = 256  # samples per reward call: reward.timeout_s limits one call


def read_samples(path: str | Path) -> list[tuple[str, object, str]]:
    """[(where, key, completion)]: key is ("task_id", str) or ("prompt_index", int)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"--samples: {path} does not exist")
    name, out, modes = path.name, [], set()
    for lineno, row in json_lines(path):
        where = f"{name}:{lineno}"
        if not isinstance(row, dict):
            raise DatasetError(where, None, f"expected an object, got {type(row).__name__}")
        if not isinstance(row.get("completion"), str):
            raise DatasetError(where, "completion", "missing or not a string")
        if isinstance(row.get("task_id"), (str, int)) and not isinstance(row["task_id"], bool):
            key = ("task_id", str(row["task_id"]))
        elif type(row.get("prompt_index")) is int and row["prompt_index"] >= 0:
            key = ("prompt_index", row["prompt_index"])
        else:
            raise DatasetError(where, "task_id", "missing: each sample names its problem by "
                               "task_id or by prompt_index (an integer >= 0)")  # fmt: skip
        modes.add(row.get("mode"))
        out.append((where, key, row["completion"], row.get("mode")))
    if not out:
        raise DatasetError(name, None, "no samples")
    drop = "greedy" if "sampled" in modes else None
    return [(w, k, c) for w, k, c, m in out if drop is None or m != drop]


def _prompts(cfg):
    from rlvr.data.dataset import load_prompt_dataset, render_prompt
    from rlvr.data.prompts import Prompt, check_columns

    d = cfg.data
    rows = load_prompt_dataset(d.eval_path or d.path, format=d.format,
                               prompt_field=d.prompt_field, answer_field=d.answer_field)  # fmt: skip
    out = []
    for ex in rows:
        check_columns(ex)
        text = render_prompt(ex, None, template=d.prompt_template, system_prompt=d.system_prompt)
        out.append(
            Prompt(text=text, ids=[], answer=ex.answer, example=ex, columns=dict(ex.columns))
        )
    return out


def _index(prompts, samples) -> list[int]:
    """The prompt each sample answers; DatasetError naming the sample's line otherwise."""
    ids = {}
    for i, p in enumerate(prompts):
        if "task_id" in p.columns:
            ids.setdefault(str(p.columns["task_id"]), i)
    out = []
    for where, (kind, value), _ in samples:
        if kind == "task_id":
            if value not in ids:
                why = (
                    "the dataset has no task_id column"
                    if not ids
                    else "no such task in the dataset"
                )
                raise DatasetError(where, "task_id", f"{value!r}: {why}")
            out.append(ids[value])
        else:
            if value >= len(prompts):
                raise DatasetError(where, "prompt_index", f"{value} >= the {len(prompts)} prompts")
            out.append(value)
    return out


def _check_answered(path: str | Path, prompts, index: list[int]) -> None:
    """DatasetError naming the samples file when a problem of the dataset has no sample."""
    missing = sorted(set(range(len(prompts))) - set(index))
    if missing:
        first = prompts[missing[0]].columns.get("task_id")
        first = f"task_id {first}" if first is not None else f"prompt_index {missing[0]}"
        answered = len(prompts) - len(missing)
        raise DatasetError(Path(path).name, None, f"answers {answered} of the {len(prompts)} "
                           f"problems ({len(missing)} missing, the first {first}); pass@k over "
                           "some problems is not the benchmark's: answer every problem, or "
                           f"--partial to score these {answered} alone")  # fmt: skip


def score_samples(cfg, path: str | Path, partial: bool = False) -> tuple[list[dict], list]:
    """(one record per sample, the prompts) for the samples in `path`, scored by `cfg`'s
    accuracy reward; a file that leaves a problem unanswered is refused unless `partial`."""
    from rlvr.rewards.scoring import Scorer
    from rlvr.rollout import Rollout

    samples = read_samples(path)
    prompts = _prompts(cfg)
    index = _index(prompts, samples)
    if not partial:
        _check_answered(path, prompts, index)
    scorer = Scorer.build(cfg, None, has_answer=any(p.answer is not None for p in prompts))
    records = []
    for start in range(0, len(samples), CHUNK):
        part = range(start, min(start + CHUNK, len(samples)))
        rows = [prompts[index[i]] for i in part]
        completions = [samples[i][2] for i in part]
        b = len(rows)
        empty = Rollout(prompt_ids=[[] for _ in rows], completion_ids=torch.zeros(b, 0, dtype=torch.long),
                        lengths=torch.zeros(b, dtype=torch.long),
                        truncated=torch.zeros(b, dtype=torch.bool), group_size=1)  # fmt: skip
        values, correct = scorer.accuracy(rows, completions, empty)
        for j, i in enumerate(part):
            records.append({"where": samples[i][0], "prompt_index": index[i],
                            "completion": completions[j], "reward": float(values[j]),
                            "correct": bool(correct[j])})  # fmt: skip
    return records, prompts


def passk_report(records: list[dict], prompts, ks, per_problem: str | None = None) -> dict:
    """pass@k over the problems that have samples (`rlvr.algos.passk`), and, with `per_problem`,
    one JSON line per problem written there (its task_id when the dataset has one)."""
    from rlvr.algos.passk import pass_at_ks, problem_counts

    counts = problem_counts((r["prompt_index"], r["correct"]) for r in records)
    result = {**pass_at_ks(counts, ks), "problems_scored": len(counts)}
    if per_problem:
        extra = {i: {"task_id": prompts[i].columns["task_id"]} for i in counts
                 if "task_id" in prompts[i].columns}  # fmt: skip
        write_problems(per_problem, counts, ks, extra)
        result["per_problem"] = str(per_problem)
    return result


def _ks(text: str) -> tuple[int, ...]:
    from rlvr.config.schema import ConfigError

    try:
        return parse_ks(text)
    except ValueError as e:
        raise ConfigError(str(e)) from None


def model_passk(args, records: list[dict], prompts) -> dict:
    """`rlvr eval --model`: the unbiased pass@k of its sampled answers for each --pass-k
    value up to --k, and the --per-problem file."""
    report = passk_report(records, prompts, [k for k in _ks(args.pass_k) if k <= args.k],
                          args.per_problem)  # fmt: skip
    report.pop("problems_scored")
    return report


def eval_samples(cfg, args) -> dict:
    """`rlvr eval --samples`: the summary printed; per-sample records to `args.output`."""
    import json

    from rlvr.config.schema import ConfigError

    if cfg.data.path is None:
        raise ConfigError("--samples: scores a dataset's problems; set --data.path or a "
                          "--data.format that has its own data (humaneval)")  # fmt: skip
    ks = _ks(args.pass_k)
    records, prompts = score_samples(cfg, args.samples, partial=args.partial)
    result = {"samples": str(args.samples), "data": cfg.data.eval_path or cfg.data.path,
              "num_samples": len(records), "num_problems": len(prompts),
              "accuracy": sum(r["correct"] for r in records) / len(records),
              **passk_report(records, prompts, ks, args.per_problem)}  # fmt: skip
    if args.partial:
        result["partial"] = f"{result['problems_scored']} of {len(prompts)} problems"
    if args.output:
        out = Path(args.output)
        out.parent.mkdir(parents=True, exist_ok=True)
        with out.open("w", encoding="utf-8") as f:
            for r in records:
                f.write(json.dumps({"mode": "samples", **r}, ensure_ascii=False) + "\n")
        result["output"] = str(out)
    return result


def parse_ks(text: str) -> tuple[int, ...]:
    """ "1,10,100" -> (1, 10, 100); ValueError naming the flag otherwise."""
    try:
        ks = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        ks = ()
    if not ks or min(ks) < 1:
        raise ValueError(f"--pass-k: expected positive integers separated by commas, got {text!r}")
    return ks


def write_problems(path: str | Path, counts, ks: Sequence[int], extra=None) -> None:
    """One JSON line per problem: its key, n, c, and pass@k for each k <= n; `extra`
    ({problem: dict}) adds fields (a task id, say)."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", encoding="utf-8") as f:
        for problem, (n, c) in counts.items():
            row = {"problem": problem, **((extra or {}).get(problem, {})), "n": n, "correct": c}
            row.update({f"pass@{k}": pass_at_k(n, c, k) for k in sorted(set(ks)) if k <= n})
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
