#!/usr/bin/env bash
# Many machines on one host: the scale-out guide's commands (docs/guides/scale_out.md) run as
# written, with only the printed substitutions, across Linux network namespaces. As root:
#
#   sudo bash scripts/multinode_sim.sh [VENV]          (default VENV: .ci-venv-vllm, built
#                                                       by scripts/vllm_env.sh when missing)
#   sudo bash scripts/multinode_sim.sh --net-only      the network alone, plain processes
#
# The nodes trainer0, trainer1 and infer0 are network namespaces, each with its own loopback,
# one veth link (eth0, 10.213.0.1-3/24) to a bridge in a fourth namespace, switch0, and an
# /etc/hosts naming the three (ip netns exec mounts /etc/netns/NODE/hosts); every command runs
# in a UTS namespace of its own under its node's hostname, so torchrun and gloo find each node
# by name as on a cluster. No namespace has a route beyond that subnet and nothing joins the
# host's network: traffic stays among these namespaces. CPU, memory and disk are the host's.
#
# Then (each part timed, `sim-step: NAME SECONDS s`):
#   guide    the guide's blocks with the substitutions (scripts/multinode_guide.py), and its
#            Slurm script expanded with stand-ins for srun and scontrol: the commands it starts
#            are the ones run here, argument for argument
#   server   the inference-node command on infer0, until /health answers from trainer0
#   train    the trainer-node command on trainer0 and trainer1 (3 steps, FSDP2 over gloo, rank
#            0 pushing the weights to infer0), then one process on trainer0 against the same
#            server; scripts/multinode_check.py: every step once, the server's log-probs the
#            trainer's, the two runs' samples and weights the same (tests/same_run.py)
#   link     infer0's link down after step 1: the run ends by name within the server timeout;
#            up again, --resume on both nodes takes the remaining steps
#   kill     every process of trainer1 killed after step 2 (ip netns pids): rank 0 ends by
#            name within KILL_BOUND_S; --resume on both nodes takes the remaining steps
#   After each fault the resumed run continues from a checkpoint and ends with the undisturbed
#   run's weights, bit for bit (the same arithmetic, replayed).
# On exit, also on failure or a signal, every process in these namespaces is killed and the
# namespaces (with their links and bridge), /etc/netns entries and the work directory are
# removed (RLVR_SIM_KEEP=1 keeps the work directory, its logs and runs, for a look).
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
refuse() { echo "multinode_sim.sh: $*" >&2; exit 2; }
[ "$(id -u)" = 0 ] || refuse "needs root to create network namespaces (sudo bash scripts/multinode_sim.sh)"
command -v ip >/dev/null && ip netns list >/dev/null 2>&1 || refuse "needs iproute2's ip netns"
command -v unshare >/dev/null || refuse "needs unshare (util-linux)"
net_only=0
if [ "${1:-}" = "--net-only" ]; then net_only=1; shift; fi
venv=$(realpath -m "${1:-.ci-venv-vllm}")
if [ $net_only = 0 ] && [ ! -e "$venv" ] && [ "$venv" = "$repo/.ci-venv-vllm" ]; then
  echo "no vLLM venv at $venv: building it (bash scripts/vllm_env.sh --install-only, minutes)"
  bash scripts/vllm_env.sh --install-only "$venv"
fi
if [ $net_only = 0 ] && ! "$venv/bin/python" -c "import vllm, rlvr" 2>/dev/null; then
  refuse "no vLLM venv at $venv (bash scripts/vllm_env.sh builds .ci-venv-vllm; or pass its path)"
fi
NODES=(trainer0 trainer1 infer0)
SWITCH=switch0
SUBNET=10.213.0
STEPS=3             # steps of every run (the config below)
SERVER_TIMEOUT=10   # rollout.vllm.timeout, s
START_S=900         # the longest the server may take to answer (vLLM's import and engine start)
RUN_S=900           # the longest a run may take
KILL_BOUND_S=120    # the longest rank 0 may take to end once trainer1 is gone
for ns in "${NODES[@]}" $SWITCH; do
  [ ! -e "/run/netns/$ns" ] || refuse "a network namespace $ns exists already, not this script's (ip netns del $ns)"
  [ ! -e "/etc/netns/$ns" ] || refuse "/etc/netns/$ns exists already, not this script's"
done

made=()
etc_netns_made=0
work=$(mktemp -d /tmp/rlvr-multinode.XXXXXX)
cleanup() {
  local rc=$? ns pids
  trap - EXIT INT TERM
  for ns in "${made[@]}"; do
    pids=$(ip netns pids "$ns" 2>/dev/null || true)
    [ -z "$pids" ] || kill -9 $pids 2>/dev/null || true
  done
  wait 2>/dev/null || true  # this shell's background jobs (each in a namespace, now killed)
  for ns in "${made[@]}"; do
    ip netns del "$ns" 2>/dev/null || true
    rm -rf "/etc/netns/$ns"
  done
  [ $etc_netns_made = 0 ] || rmdir /etc/netns 2>/dev/null || true
  if [ "${RLVR_SIM_KEEP:-0}" = 1 ]; then echo "kept: $work"; else rm -rf "$work"; fi
  left=$(ip netns list | awk '{print $1}' | grep -xE "$(IFS='|'; echo "${made[*]:-none}")" || true)
  [ -z "$left" ] || { echo "multinode_sim.sh: could not remove $left" >&2; rc=1; }
  exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
fail() {
  echo "multinode_sim.sh: FAILED: $*" >&2
  for log in $(find "$work" -name '*.log' | sort); do
    echo "--- ${log#"$work"/} (last lines)" >&2
    tail -n 12 "$log" >&2
  done
  exit 1
}
step_start=$SECONDS
step() { echo "sim-step: $1 $((SECONDS - step_start)) s"; step_start=$SECONDS; }

# -- the network ------------------------------------------------------------------------
node() {  # NODE COMMAND: COMMAND (bash text) in NODE's network namespace, under its hostname
  ip netns exec "$1" unshare --uts -- bash -c 'hostname "$0" && eval "$1"' "$1" "$2"
}
[ -d /etc/netns ] || { mkdir /etc/netns; etc_netns_made=1; }
ip netns add $SWITCH || refuse "cannot create a network namespace here (ip netns add failed)"
made+=($SWITCH)
ip -n $SWITCH link set lo up
ip -n $SWITCH link add br0 type bridge
ip -n $SWITCH link set br0 up
hosts="127.0.0.1 localhost"
i=1
for n in "${NODES[@]}"; do hosts+=$'\n'"$SUBNET.$i $n"; i=$((i + 1)); done
i=1
for n in "${NODES[@]}"; do
  ip netns add "$n"
  made+=("$n")
  ip -n $SWITCH link add "$n" type veth peer name eth0 netns "$n"
  ip -n $SWITCH link set "$n" master br0 up
  ip -n "$n" link set lo up
  ip -n "$n" addr add "$SUBNET.$i/24" dev eth0
  ip -n "$n" link set eth0 up
  mkdir "/etc/netns/$n"
  echo "$hosts" > "/etc/netns/$n/hosts"
  echo "node $n: $SUBNET.$i/24 on eth0; routes: $(ip -n "$n" route | tr '\n' ';')"
  i=$((i + 1))
done
unset http_proxy https_proxy HTTP_PROXY HTTPS_PROXY all_proxy ALL_PROXY no_proxy NO_PROXY
unset RANK LOCAL_RANK WORLD_SIZE LOCAL_WORLD_SIZE MASTER_ADDR MASTER_PORT
export OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 HEAD=trainer0
[ $net_only = 1 ] || export PATH="$venv/bin:$PATH" PYTHONPATH="$repo/src${PYTHONPATH:+:$PYTHONPATH}"
# the nodes reach each other by name and nothing beyond the subnet (no route: nothing is sent)
reach() {  # FROM ADDRESS PORT [SECONDS]: "ok", or the error of a connection from node FROM
  node "$1" "python3 -c \"import socket
try: socket.create_connection(('$2', $3), timeout=${4:-3}).close(); print('ok')
except OSError as e: print(e.strerror or e)\""
}
node infer0 "exec python3 -m http.server --bind infer0 8000" > "$work/http.log" 2>&1 &
for n in trainer0 trainer1; do
  for _ in $(seq 50); do [ "$(reach $n infer0 8000)" = ok ] && break; sleep 0.2; done
  [ "$(reach $n infer0 8000)" = ok ] || fail "$n cannot reach infer0:8000"
done
beyond=$(reach infer0 10.213.1.1 80)
[ "$beyond" = "Network is unreachable" ] || fail "infer0 reached beyond $SUBNET.0/24: $beyond"
echo "trainer0 and trainer1 reach infer0:8000 by name; beyond $SUBNET.0/24: $beyond"
ip -n infer0 link set eth0 down
down=$(reach trainer0 infer0 8000 1)
ip -n infer0 link set eth0 up
[ "$down" != ok ] || fail "trainer0 reached infer0 with infer0's link down"
echo "infer0's link down: trainer0 -> infer0:8000: $down; up again"
kill -9 $(ip netns pids infer0)
wait 2>/dev/null || true
step network
if [ $net_only = 1 ]; then echo "multinode_sim: the network ok (--net-only)"; exit 0; fi

# -- the guide's commands, and its Slurm script against them ------------------------------
cat > "$work/config.yaml" <<EOF
# the simulation's run: rlvr-tiny, $STEPS steps of 8 prompts x 4 samples x 32 tokens, seeds per
# prompt (so that 2 ranks sample what one process samples), a checkpoint every step
rollout: {prompts_per_step: 8, group_size: 4, max_new_tokens: 32, seed_per_prompt: true,
          vllm: {timeout: $SERVER_TIMEOUT}}
train: {max_steps: $STEPS, eval_size: 0, threads: 1, save_every: 1, keep_checkpoints: 5,
        output_dir: run}
optim: {lr: 1.0e-3}
EOF
python "$repo/scripts/multinode_guide.py" commands "$work" || fail "the guide's commands"
python "$repo/scripts/multinode_guide.py" slurm "$work" || fail "the Slurm script"
for f in server trainer; do echo "--- $f.sh, as run:"; cat "$work/$f.sh"; done
step guide

node infer0 "cd $work && exec bash server.sh" > "$work/infer0.log" 2>&1 &
server=$!
deadline=$((SECONDS + START_S))
until [ "$(reach trainer0 infer0 8000)" = ok ] && node trainer0 \
  "python3 -c \"import urllib.request as u; u.urlopen('http://infer0:8000/health', timeout=5)\"" 2>/dev/null; do
  kill -0 $server 2>/dev/null || fail "the server on infer0 exited"
  [ $SECONDS -lt $deadline ] || fail "the server on infer0 did not answer within $START_S s"
  sleep 2
done
echo "infer0's server answers http://infer0:8000/health from trainer0"
step server

declare -A ranks=()
start_nodes() {  # RUN SCRIPT: SCRIPT on trainer0 and trainer1 in $work/RUN, in the background
  mkdir -p "$work/$1"
  for n in trainer0 trainer1; do
    node $n "cd $work/$1 && exec bash ../$2" > "$work/$1/$n-${2%.sh}.log" 2>&1 &
    ranks[$n]=$!
  done
}
wait_nodes() {  # SECONDS: every node's torchrun ended in time; their exit codes in $codes
  local deadline=$((SECONDS + $1)) n
  while kill -0 "${ranks[@]}" 2>/dev/null; do
    [ $SECONDS -lt $deadline ] || return 1
    sleep 1
  done
  codes=""
  for n in trainer0 trainer1; do
    [ -n "${ranks[$n]:-}" ] || continue
    wait "${ranks[$n]}" && codes+="$n:0 " || codes+="$n:$? "
  done
}
on_both() {  # RUN SCRIPT: run SCRIPT on both nodes to the end; both must exit 0
  start_nodes "$1" "$2"
  wait_nodes $RUN_S || fail "$1: $2 did not end within $RUN_S s"
  [ "$codes" = "trainer0:0 trainer1:0 " ] || fail "$1: $2 exited $codes"
}
wait_step() {  # RUN STEP: until RUN has logged STEP
  local deadline=$((SECONDS + RUN_S))
  local metrics="$work/$1/run/metrics.jsonl"
  until [ -f "$metrics" ] && [ "$(wc -l < "$metrics")" -ge "$2" ]; do
    kill -0 "${ranks[@]}" 2>/dev/null || fail "$1 ended before step $2"
    [ $SECONDS -lt $deadline ] || fail "$1: no step $2 within $RUN_S s"
    sleep 0.5
  done
}
check() { python "$repo/scripts/multinode_check.py" "$@" || fail "multinode_check.py $*"; }
resumed() {  # RUN: its resume continued from a checkpoint (not from step 0)
  grep -h "^resuming .* from step-" "$work/$1/trainer0-resume.log" | grep -v "(step 0)" \
    || fail "$1: --resume did not continue from a checkpoint"
}

echo "== 2 trainer nodes, 1 rank each, against infer0"
on_both main trainer.sh
check run "$work/main/run" $STEPS
echo "== one process on trainer0 against the same server"
mkdir "$work/one"
node trainer0 "cd $work/one && python -m rlvr train ../config.yaml --rollout.engine=vllm \
  --rollout.vllm.mode=server --rollout.vllm.urls=http://infer0:8000" > "$work/one/trainer0.log" 2>&1 &
wait $! || fail "the one-process run"  # in the background: a signal to this script acts at once
check same "$work/one/run" "$work/main/run"
step train

echo "== infer0's link down after step 1"
start_nodes link trainer.sh
wait_step link 1
ip -n infer0 link set eth0 down
down_at=$SECONDS
wait_nodes $((SERVER_TIMEOUT + 90)) || fail "link: the run went on $((SERVER_TIMEOUT + 90)) s with infer0 unreachable"
echo "the run ended $((SECONDS - down_at)) s after the link went down ($codes), by name:"
grep -h "^error: rollout.vllm: the vLLM server at http://infer0:8000 stopped answering" \
  "$work"/link/*.log || fail "link: no named error for http://infer0:8000"
ip -n infer0 link set eth0 up
kill -0 $server 2>/dev/null || fail "the server on infer0 exited while its link was down"
echo "== link up; --resume on both nodes"
on_both link resume.sh
resumed link
check run "$work/link/run" $STEPS "$work/main/run"
step link

echo "== every process of trainer1 killed after step 2 (checkpoint 1 written)"
start_nodes kill trainer.sh
wait_step kill 2
kill -9 $(ip netns pids trainer1)
killed_at=$SECONDS
ranks=([trainer0]=${ranks[trainer0]})
wait_nodes $KILL_BOUND_S || fail "kill: rank 0 still ran $KILL_BOUND_S s after trainer1 was killed"
echo "rank 0 ended $((SECONDS - killed_at)) s after trainer1's processes were killed ($codes), by name:"
grep -h "^error: torch.distributed: rank 0 lost contact" "$work/kill/trainer0-trainer.log" \
  || fail "kill: no named error from rank 0"
echo "checkpoints left: $(ls "$work/kill/run/checkpoints" 2>/dev/null | tr '\n' ' ')"
echo "== --resume on both nodes"
on_both kill resume.sh
resumed kill
check run "$work/kill/run" $STEPS "$work/main/run"
step kill
echo "multinode_sim: ok ($SECONDS s)"
