"""rlvr against TRL's GRPOTrainer at a real vocabulary: peak RSS and time of one training step.

    python bench/logits_vs_trl.py                    # 256, 1,024 and 4,096 response tokens
    python bench/logits_vs_trl.py --lengths 256      # one length (appends to the results)
    python bench/logits_vs_trl.py --table            # the table of what the results hold

The model: random weights (seed 0) from a Qwen2 config with Qwen2's 151,936-token vocabulary
and tied embeddings, 2 layers, hidden 256, 4 heads, intermediate 1024 (41.0M parameters, 38.9M
of them the embedding), loaded by path by both trainers. Everything else is bench/vs_trl.py's
(its children run here: the same settings, timing hooks and forced lengths), with one prompt x
G=8 a step and all 8 rows in one micro-batch for both (TRL `per_device_train_batch_size=8`,
rlvr `optim.micro_batch_sequences=8`), beta 0, fp32, one thread, rlvr's default engine.
At this vocabulary the full fp32 logits of 8 x T tokens take 8 x T x 151,936 x 4 bytes:
1.2 GB at 256 tokens, 5.0 GB at 1,024, 19.9 GB at 4,096.

Every run is a child process of its own under an address-space limit (`RLIMIT_AS`,
`--limit-gib`, the same for both trainers), so a run that needs more fails to allocate inside
its own process: that is recorded as out of memory, with the allocation that failed, and the
next run starts. Peak RSS is the child's `ru_maxrss` (from `wait4`, so a run that died has
one too). Runs alternate TRL, rlvr at each length (the order flips every round). Before a run
starts, the machine must have `--limit-gib` of `MemAvailable` (waited for, up to
`--wait-s`), so that a run filling its limit cannot push other processes into the kernel's
OOM killer. Each finished run is one JSON line in `--results`; a rerun skips the runs there.
The summary (the table's numbers) is written to the same name with `.json`.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import vs_trl  # noqa: E402
from _shared import build_qwen2  # noqa: E402

VOCAB = 151_936
SHAPE = dict(
    hidden_size=256,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=4,
    intermediate_size=1024,
    vocab_size=VOCAB,
    tie_word_embeddings=True,
    max_position_embeddings=8192,
)
LENGTHS = (256, 1024, 4096)
GROUP = 8
OOM_MARKS = ("can't allocate memory", "cannot allocate memory", "memoryerror", "bad_alloc")


def mem_available_gib() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / 2**20
    return 0.0


def wait_for_memory(need_gib: float, wait_s: float) -> float:
    """Wait until `need_gib` of MemAvailable; return what is available when done."""
    t0 = time.monotonic()
    while (got := mem_available_gib()) < need_gib and time.monotonic() - t0 < wait_s:
        time.sleep(10)
    return got


def failure(status: int, stderr: str) -> tuple[str, str]:
    """(outcome, the line that says why) of a child that did not finish."""
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    for ln in reversed(lines):
        if any(m in ln.lower() for m in OOM_MARKS):
            return "oom", ln[:300]
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        return ("oom" if sig == 9 else "error"), f"killed by signal {sig}"
    return "error", (lines[-1][:300] if lines else f"exit {os.waitstatus_to_exitcode(status)}")


def run_one(kind: str, length: int, args, model_dir: Path, work: Path) -> dict:
    """One child of bench/vs_trl.py under the address-space limit; its outcome and numbers."""
    import subprocess

    tag = f"{kind}-T{length}"
    child_args = argparse.Namespace(
        warmup=args.warmup,
        steps=args.steps,
        threads=args.threads,
        seed=0,
        rlvr_engine=args.rlvr_engine,
        trl_gradient_checkpointing=False,
        bf16=False,
        prompts=1,
        group=GROUP,
        length=length,
        system_prompt=None,
    )
    cmd, env, out = vs_trl.child_command(kind, 0.0, child_args, model_dir, work, tag)
    out.unlink(missing_ok=True)
    limit = int(args.limit_gib * 2**30)

    def limit_address_space() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    err_path = work / f"{tag}.stderr"
    t0 = time.perf_counter()
    with err_path.open("w") as err:
        proc = subprocess.Popen(
            cmd, env=env, stdout=subprocess.DEVNULL, stderr=err, preexec_fn=limit_address_space
        )
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
    rec = {
        "kind": kind,
        "length": length,
        "limit_gib": args.limit_gib,
        "wall_s": time.perf_counter() - t0,
        "peak_rss_mib": usage.ru_maxrss / 1024,
        "threads": args.threads,
    }
    if status == 0 and out.exists():
        res = vs_trl.checked_result(kind, child_args, out, tag)
        timed = res["timed"]
        rec["outcome"] = "ok"
        rec["peak_rss_mib"] = res["peak_rss_mib"]  # the child's own, before its last matmuls
        for key in ("step", "step_cpu", "generation", "generation_cpu", "train", "train_cpu"):
            rec[key + "_s"] = statistics.median(s[key] for s in timed)
        rec["engine"] = res.get("engine")
    else:
        rec["outcome"], rec["why"] = failure(status, err_path.read_text())
    return rec


def load(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()]


def summarise(records: list[dict]) -> dict:
    """Per length and trainer: the outcome, the largest peak RSS and the median step times."""
    out: dict = {}
    for length in sorted({r["length"] for r in records}):
        row = {}
        for kind in ("trl", "rlvr"):
            rs = [r for r in records if r["length"] == length and r["kind"] == kind]
            if not rs:
                continue
            ok = [r for r in rs if r["outcome"] == "ok"]
            s = {"runs": len(rs), "ok": len(ok), "limit_gib": rs[-1]["limit_gib"]}
            if ok:
                s["peak_rss_mib"] = max(r["peak_rss_mib"] for r in ok)
                for key in ("step_s", "step_cpu_s", "generation_s", "train_s", "train_cpu_s"):
                    s[key] = statistics.median(r[key] for r in ok)
                    s[key + "_spread"] = [min(r[key] for r in ok), max(r[key] for r in ok)]
            else:
                s["outcome"] = rs[-1]["outcome"]
                s["why"] = rs[-1].get("why", "")
                s["peak_rss_mib_at_failure"] = max(r["peak_rss_mib"] for r in rs)
            row[kind] = s
        if "peak_rss_mib" in row.get("rlvr", {}) and "peak_rss_mib" in row.get("trl", {}):
            row["rss_ratio"] = row["rlvr"]["peak_rss_mib"] / row["trl"]["peak_rss_mib"]
            row["speedup_step"] = row["trl"]["step_s"] / row["rlvr"]["step_s"]
            row["speedup_step_cpu"] = row["trl"]["step_cpu_s"] / row["rlvr"]["step_cpu_s"]
        out[str(length)] = row
    return out


def fmt_mib(s: dict) -> str:
    if "peak_rss_mib" in s:
        return f"{s['peak_rss_mib']:,.0f} MiB"
    return f"out of memory (limit {s['limit_gib']:g} GiB)" if s.get("outcome") == "oom" else "error"


def fmt_step(s: dict) -> str:
    if "step_s" not in s:
        return "-"
    return f"{s['step_s']:.1f} s ({s['step_cpu_s']:.1f} CPU s)"


def table(summary: dict) -> str:
    head = (
        "| response tokens | full fp32 logits | TRL peak RSS | rlvr peak RSS | rlvr / TRL "
        "| TRL step | rlvr step | rlvr train phase |\n|---|---|---|---|---|---|---|---|\n"
    )
    rows = []
    for length, row in summary.items():
        trl, rl = row.get("trl", {}), row.get("rlvr", {})
        ratio = f"{row['rss_ratio']:.2f}" if "rss_ratio" in row else "-"
        logits = GROUP * int(length) * VOCAB * 4 / 1e9
        train = f"{rl['train_s']:.1f} s" if "train_s" in rl else "-"
        rows.append(
            f"| {int(length):,} | {logits:.1f} GB | {fmt_mib(trl)} | {fmt_mib(rl)} | {ratio} "
            f"| {fmt_step(trl)} | {fmt_step(rl)} | {train} |"
        )
    return head + "\n".join(rows)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lengths", default=",".join(map(str, LENGTHS)))
    p.add_argument("--rounds", type=int, default=1, help="TRL / rlvr pairs a length")
    p.add_argument("--warmup", type=int, default=0, help="untimed steps before the timed one")
    p.add_argument("--steps", type=int, default=1, help="timed steps a run")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--limit-gib", type=float, default=16.0, help="RLIMIT_AS of every run")
    p.add_argument("--wait-s", type=float, default=900, help="longest wait for MemAvailable")
    p.add_argument("--rlvr-engine", default=None, help="rollout.engine (default: rlvr's)")
    p.add_argument("--trainers", default="trl,rlvr", help="which of the two to run")
    p.add_argument("--results", default=str(HERE / "results" / "logits_vs_trl.jsonl"))
    p.add_argument("--work", default="/tmp/logits_vs_trl", help="model and run files")
    p.add_argument("--table", action="store_true", help="only print the table of the results")
    args = p.parse_args()
    path = Path(args.results)
    records = load(path)
    if not args.table:
        work = Path(args.work)
        model_dir = work / "model"
        if not (model_dir / "config.json").exists():
            build_qwen2(model_dir, seed=0, **SHAPE)
        shape = vs_trl.model_shape(model_dir)  # counts an untied head: take it off
        print(
            f"Qwen2 {(shape['total'] - shape['d'] * VOCAB) / 1e6:.1f}M parameters (vocabulary {VOCAB:,}, tied), "
            f"1 prompt x G={GROUP}, one micro-batch of {GROUP}, fp32, {args.threads} thread(s), "
            f"RLIMIT_AS {args.limit_gib:g} GiB a run",
            flush=True,
        )
        done = {(r["kind"], r["length"], r.get("round", 0)) for r in records}
        for length in map(int, args.lengths.split(",")):
            for r in range(args.rounds):
                for kind in ("trl", "rlvr") if r % 2 == 0 else ("rlvr", "trl"):
                    if (kind, length, r) in done or kind not in args.trainers.split(","):
                        continue
                    free = wait_for_memory(args.limit_gib, args.wait_s)
                    if free < args.limit_gib:
                        print(f"  {kind} T={length}: skipped, MemAvailable {free:.1f} GiB")
                        continue
                    rec = run_one(kind, length, args, model_dir, work)
                    rec.update(round=r, mem_available_gib=round(free, 1), load=os.getloadavg())
                    records.append(rec)
                    path.parent.mkdir(parents=True, exist_ok=True)
                    with path.open("a") as f:
                        f.write(json.dumps(rec) + "\n")
                    what = (
                        rec.get("why", "")
                        if rec["outcome"] != "ok"
                        else (
                            f"step {rec['step_s']:.1f} s ({rec['step_cpu_s']:.1f} CPU s), "
                            f"train {rec['train_s']:.1f} s"
                        )
                    )
                    print(
                        f"  T={length} round {r} {kind:>4}: {rec['outcome']}, peak RSS "
                        f"{rec['peak_rss_mib']:,.0f} MiB, {what} (run {rec['wall_s']:.0f} s)",
                        flush=True,
                    )
    summary = summarise(records)
    path.with_suffix(".json").write_text(json.dumps(summary, indent=1) + "\n")
    print(table(summary))


if __name__ == "__main__":
    main()
