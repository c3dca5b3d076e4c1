"""The rollout engines side by side: `fast`, `hf` and `vllm` on the same model, prompts and lengths.

    OMP_NUM_THREADS=1 python bench/engines.py            # 3 shapes x {no tools, tools}, 2 rounds, probe
    python bench/engines.py --table                      # the Markdown table of the results file

Needs vLLM's CPU build (`bash scripts/vllm_env.sh VENV`, then VENV's python); without it the
script stops, naming the missing engine (`--engines fast,hf` runs without it).

Shapes (bench/shapes.py's grid where they come from it):
- `tiny`: the built-in `rlvr-tiny` at the default run's rollout: 16 arithmetic prompts x G=8,
  32 tokens forced (`min_new_tokens`). With tools: the `calc` task's prompts, its `calc` tool
  and budgets (160 model tokens, 224 in all), lengths as the trained model ends them.
- `centre`: the grid's centre, a 27.6M-parameter Qwen2 (random init, seed 0), one 47-token
  arithmetic prompt x G=8, 256 tokens; `response1024`: the same with 1,024 tokens.
  A random model would end rows at its EOS, so the EOS given to the engines is an id outside
  the vocabulary (never sampled) and the model's own is removed from its saved config. With
  tools the `calc` tool answers every `</tool_call>`, which is one token of the character
  vocabulary, sampled about once in 108 tokens (calc's error reply, ~53 tokens, is the tool
  turn), up to `rollout.max_tool_calls`=4, in a budget of the response length + 256.

Every engine is built by `build_engine` (rollout.engine=NAME) with the `EngineSite` training
would give it (the CPU, the tools, the longest sequence, the rows of a call). Engines of one
shape are built together, warmed up once, then timed in rounds that alternate fast, hf,
vllm, fast, ... so that the machine's load hits every engine alike. Tokens/s counts the
model's own tokens (not tool turns) per second of wall time and per CPU second of the process
(`time.process_time`, all threads; vLLM runs in this process), which a machine shared with
other jobs inflates less. Seeds are per prompt (`row_seeds`), as in training.

The probe (`--probe`, on by default) explains the table: on the 27.6M model, each engine's
time for 1 token (prefill and one step) and for 64, at 8 rows and 64 rows (8 prompts x 8):
prefill, the per-step decode time, and per row-token.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import torch  # noqa: E402
from _shared import build_qwen2, load_char_tokenizer, set_threads, task_prompts  # noqa: E402
from shapes import MODELS  # noqa: E402

from rlvr.config.load import load_config  # noqa: E402
from rlvr.config.presets import TINY_TASK_DEFAULTS  # noqa: E402
from rlvr.data.prompts import load_prompts  # noqa: E402
from rlvr.models import load_model, load_tokenizer  # noqa: E402
from rlvr.rollout import EngineSite, SamplingParams, build_engine  # noqa: E402
from rlvr.tools import Toolbox  # noqa: E402

ENGINE_NAMES = ("fast", "hf", "vllm")
PROBE_TOKENS = 32


def grid_model(work: Path):
    """The grid's 27.6M Qwen2 (bench/shapes.py's centre, seed 0), saved and loaded fp32."""
    from transformers import AutoModelForCausalLM

    path = work / "centre30M"
    build_qwen2(path, seed=0, max_position_embeddings=2048, **MODELS["30M"])
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    return model, load_char_tokenizer(str(path))


def tiny_work(tools: bool):
    """rlvr-tiny, its tokenizer and the default run's prompts (calc's with tools)."""
    over = {"data": {"task": "calc" if tools else "arithmetic"}}
    if tools:
        over["rollout"] = TINY_TASK_DEFAULTS["calc"]["rollout"]
    cfg = load_config(overrides=over)
    tok, model = load_tokenizer("rlvr-tiny"), load_model("rlvr-tiny").eval()
    source = load_prompts(cfg, tok, model.config.max_position_embeddings)
    prompts = [q.ids for q in source.train[: cfg.rollout.prompts_per_step]]
    return model, tok, prompts, cfg


def shapes_for(model_name: str, tools: bool, quick: bool) -> list[dict]:
    """(shape name, prompts, G, model tokens, whole-response budget, forced?) of a model."""
    if model_name == "tiny":
        if tools:
            r = TINY_TASK_DEFAULTS["calc"]["rollout"]
            return [dict(shape="tiny", n=8, new=r["max_new_tokens"], total=r["max_total_tokens"])]
        return [dict(shape="tiny", n=8, new=16 if quick else 32, total=None, forced=True)]
    if tools:  # min_new_tokens is refused with tools, and a random model ends rows at its EOS
        return []
    out = [dict(shape="centre", n=8, new=64 if quick else 256, total=None, forced=True)]
    if not quick:
        out.append(dict(shape="response1024", n=8, new=1024, total=None, forced=True))
    return out


def build_all(names, model, ids, toolbox, max_len: int, rows: int) -> dict:
    engines = {}
    for name in names:
        cfg = load_config(overrides={"rollout": {"engine": name}})  # vllm: the model's fp32
        site = EngineSite(device=torch.device("cpu"), tools=toolbox, max_model_len=max_len,
                          max_rows=rows)  # fmt: skip
        t0 = time.perf_counter()
        engines[name] = build_engine(cfg, model, ids, site)
        print(f"  built {name} in {time.perf_counter() - t0:.1f} s", flush=True)
    return engines


def timed(engine, prompts, params) -> dict:
    w0, c0 = time.perf_counter(), time.process_time()
    out = engine.generate(prompts, params)
    wall, cpu_s = time.perf_counter() - w0, time.process_time() - c0
    tool = out.tool_mask.sum(1) if out.tool_mask is not None else torch.zeros_like(out.lengths)
    model_tokens = int((out.lengths - tool).sum())
    calls = float(out.tool_calls.float().mean()) if out.tool_calls is not None else 0.0
    return dict(wall=wall, cpu=cpu_s, tokens=model_tokens, calls=calls,
                tool_tokens=float(tool.float().mean()))  # fmt: skip


def measure(engines, prompts, s: dict, rounds: int, seed: int) -> list[dict]:
    base = dict(n=s["n"], max_new_tokens=s["new"], temperature=1.0,
                row_seeds=tuple(range(len(prompts))))  # fmt: skip
    if s.get("forced"):
        base["min_new_tokens"] = s["new"]
    runs = {name: [] for name in engines}
    for r in range(rounds):
        for name, engine in engines.items():
            res = timed(engine, prompts, SamplingParams(seed=seed + r, **base))
            runs[name].append(res)
            print(f"    round {r} {name:>4}: {res['tokens']:6d} tokens, {res['wall']:7.2f} s wall, "
                  f"{res['cpu']:7.2f} s CPU, calls/row {res['calls']:.2f}", flush=True)  # fmt: skip
    out = []
    for name, rs in runs.items():
        out.append(dict(
            engine=name,
            tok_per_s=statistics.median(x["tokens"] / x["wall"] for x in rs),
            tok_per_cpu_s=statistics.median(x["tokens"] / x["cpu"] for x in rs),
            tokens=statistics.median(x["tokens"] for x in rs),
            calls_per_row=statistics.median(x["calls"] for x in rs),
            tool_tokens_per_row=statistics.median(x["tool_tokens"] for x in rs),
            runs=rs,
        ))  # fmt: skip
    return out


def probe(engines, prompts8) -> list[dict]:
    """Prefill and decode-step times at 8 and 64 rows (see the module doc)."""
    out = []
    for rows_prompts in (prompts8[:1], prompts8):
        rows = 8 * len(rows_prompts)
        for name, engine in engines.items():
            t = {}
            for new in (1, PROBE_TOKENS):
                params = SamplingParams(n=8, max_new_tokens=new, min_new_tokens=new, seed=0,
                                        row_seeds=tuple(range(len(rows_prompts))))  # fmt: skip
                t[new] = timed(engine, rows_prompts, params)["cpu"]
            step = (t[PROBE_TOKENS] - t[1]) / (PROBE_TOKENS - 1)
            rec = dict(engine=name, rows=rows, first_token_cpu_s=t[1], step_cpu_ms=step * 1e3,
                       us_per_row_token=step / rows * 1e6, prefill_share=t[1] / t[PROBE_TOKENS])  # fmt: skip
            print(f"  probe {name:>4} rows {rows:3d}: 1 token {t[1] * 1e3:7.1f} ms, decode step "
                  f"{step * 1e3:7.2f} ms = {step / rows * 1e6:7.1f} us/row-token", flush=True)  # fmt: skip
            out.append(rec)
    return out


def model_rounds(model_name, args, work, results: list) -> None:
    for tools in (False, True):
        if not shapes_for(model_name, tools, args.quick):
            continue
        if model_name == "tiny":
            model, tok, prompts, cfg = tiny_work(tools)
            ids = tok
            max_calls = cfg.rollout.max_tool_calls
        else:
            model, tok = grid_model(work)
            ids = tok
            prompts = [tok(t).input_ids for t, _ in task_prompts(tok, "arithmetic", "train", 8, 0)]
            max_calls = 4
        shapes = shapes_for(model_name, tools, args.quick)
        widest = max(s["total"] or s["new"] for s in shapes)
        max_len = min(model.config.max_position_embeddings, max(map(len, prompts)) + widest)
        rows = max(64 if model_name != "tiny" else 0, 8 * len(prompts))
        box = None
        if tools:
            box = Toolbox(["calc"], tok, max_calls=max_calls, max_total_tokens=None)
        print(f"\n== {model_name}, tools {'on' if tools else 'off'}: "
              f"{sum(p.numel() for p in model.parameters()) / 1e6:.1f}M params", flush=True)  # fmt: skip
        engines = build_all(args.engines, model, ids, box, max_len, rows)
        for engine in engines.values():  # warm-up: lazy imports, first allocations
            engine.generate(prompts[:1], SamplingParams(n=8, max_new_tokens=16, seed=0))
        for s in shapes:
            use = prompts if model_name == "tiny" else prompts[:1]
            if box is not None:
                box.max_total_tokens = s["total"]
            print(f"  {s['shape']}: {len(use)} prompts x {s['n']}, {s['new']} tokens", flush=True)
            for rec in measure(engines, use, s, args.rounds, args.seed):
                rec.update(shape=s["shape"], tools=tools, prompts=len(use), group=s["n"],
                           max_new_tokens=s["new"], max_total_tokens=s["total"],
                           forced=bool(s.get("forced")) or model_name != "tiny",
                           prompt_tokens=statistics.mean(map(len, use)),
                           threads=args.threads, time=time.strftime("%Y-%m-%dT%H:%M:%SZ"))  # fmt: skip
                results.append(rec)
        if args.probe and model_name != "tiny" and not tools:
            for rec in probe(engines, prompts):
                results.append(dict(rec, shape="probe", threads=args.threads))
        for engine in engines.values():
            engine.release()
        del engines


SHAPE_ORDER = ("tiny", "centre", "response1024")


def table(recs: list[dict]) -> str:
    """tokens/s (CPU time, then wall) per shape and tools, one column per engine."""
    cell = {(r["shape"], r["tools"], r["engine"]): r for r in recs if r["shape"] != "probe"}
    names = [n for n in ENGINE_NAMES if any(k[2] == n for k in cell)]
    head = "| shape | tools | " + " | ".join(f"{n} tok/CPU-s (wall)" for n in names)
    rows = [head + " | fastest |", "|" + "---|" * (len(names) + 3)]
    for shape in SHAPE_ORDER:
        for tools in (False, True):
            got = [cell.get((shape, tools, n)) for n in names]
            if not any(got):
                continue
            first = next(g for g in got if g)
            what = (f"{shape} ({first['prompts']} x {first['group']}, "
                    f"{first['max_new_tokens']}{' forced' if first['forced'] else ''})")  # fmt: skip
            best = max((g for g in got if g), key=lambda g: g["tok_per_cpu_s"])
            txt = [f"{g['tok_per_cpu_s']:,.0f} ({g['tok_per_s']:,.0f})" if g else "-" for g in got]
            calls = f", {first['calls_per_row']:.1f} calls/row" if tools else ""
            rows.append(f"| {what} | {'yes' + calls if tools else 'no'} | " + " | ".join(txt)
                        + f" | {best['engine']} |")  # fmt: skip
    probes = [r for r in recs if r["shape"] == "probe"]
    if probes:
        rows += ["", "| engine | rows | prefill + 1 token ms | decode step ms | us per row-token |",
                 "|---|---|---|---|---|"]  # fmt: skip
        for p in probes:
            rows.append(f"| {p['engine']} | {p['rows']} | {p['first_token_cpu_s'] * 1e3:,.1f} | "
                        f"{p['step_cpu_ms']:,.2f} | {p['us_per_row_token']:,.1f} |")  # fmt: skip
    return "\n".join(rows)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--engines", default=",".join(ENGINE_NAMES))
    p.add_argument(
        "--models", default="tiny,centre", help="tiny and/or centre (the 27.6M grid model)"
    )
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-probe", dest="probe", action="store_false")
    p.add_argument("--quick", action="store_true", help="short lengths, no 1,024 point: a test")
    p.add_argument("--results", default=str(HERE / "results" / "engines.jsonl"))
    p.add_argument("--table", action="store_true", help="print the table of --results and exit")
    args = p.parse_args()
    path = Path(args.results)
    if args.table:
        print(table([json.loads(x) for x in path.read_text().splitlines() if x.strip()]))
        return
    args.engines = args.engines.split(",")
    set_threads(args.threads)
    results: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="engines_") as work:
        for model_name in args.models.split(","):
            model_rounds(model_name, args, Path(work), results)
    results = _kept(path, results) + results
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        for rec in results:
            f.write(json.dumps(rec) + "\n")
    print("\n" + table(results))


def _kept(path: Path, measured: list[dict]) -> list[dict]:
    """The results file's records of the shapes this invocation did not measure: a run of
    `--models tiny` replaces the tiny rows and keeps the 27.6M model's and the probe's."""
    if not path.exists():
        return []
    shapes = {r["shape"] for r in measured}
    old = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    return [r for r in old if r["shape"] not in shapes]


if __name__ == "__main__":
    main()
