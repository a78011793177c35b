#!/usr/bin/env bash
# Faults across hosts (scripts/netns_hosts.sh): train_gpt --strategy ddp over 2 hosts x 1
# rank through loomrun --nnodes 2, over each BACKEND given (tcp, and ucx where built), then
#   1. the link of host 1 is cut mid-training: both ranks stop with a CommError naming the
#      other and its host (LOOM_HOST_ID host0, host1) within the collective timeout
#      (--timeout 3), and both loomruns exit non-zero;
#   2. host 1 is killed (its loomrun and rank, SIGKILL): the rank on host 0 stops naming
#      rank 1 and host1, and host 0's loomrun exits non-zero.
# (One rank per host: the ranks use no shared memory, so there is no segment to leave.)
#   faults.sh SOURCE_DIR LOOMRUN TRAIN_GPT BACKEND...   (exit 77: namespaces refused, skip)
set -euo pipefail
S=$1; LOOMRUN=$2; TRAIN_GPT=$3; shift 3
BACKENDS=("$@")
[ ${#BACKENDS[@]} -gt 0 ] || { echo "faults.sh: no BACKEND given" >&2; exit 2; }
prefix="lf$(($$ % 100000))"
d=$(mktemp -d)
cleanup() {  # the nodes' sessions first: removing a namespace does not stop its processes
  for f in "$d"/*.pid; do
    [ -f "$f" ] && kill -9 -- "-$(cat "$f")" 2> /dev/null || true
  done
  bash "$S/scripts/netns_hosts.sh" down "$prefix"
  rm -rf "$d"
}
trap cleanup EXIT
bash "$S/scripts/netns_hosts.sh" up "$prefix" 2  # exits 77 where the kernel refuses
LOOM_STORE_SECRET=$(od -An -tx1 -N32 /dev/urandom | tr -d ' \n')
export LOOM_STORE_SECRET

start_nodes() {  # scenario backend: each node's loomrun in a session of its own (killable)
  for node in 0 1; do
    ip netns exec "$prefix-h$node" env UCX_TLS=tcp LOOM_HOST_ID="host$node" \
      setsid timeout 120 "$LOOMRUN" --nnodes 2 \
      --node-rank "$node" --nproc-per-node 1 --master-addr 10.77.0.1 --master-port 29500 \
      "$TRAIN_GPT" --strategy ddp --layers 1 --heads 2 --embd 16 --ctx 16 --batch 2 \
      --steps 1000000 --log-interval 100 --timeout 3 --process-group-backend "$2" \
      > "$d/$1.node$node.log" 2>&1 &
    echo $! > "$d/$1.node$node.pid"
  done
  for _ in $(seq 200); do  # training is under way once rank 0 logged a step
    grep -q "step 101/" "$d/$1.node0.log" 2>/dev/null && return 0
    sleep 0.1
  done
  echo "$1: training did not start"; cat "$d/$1".node*.log; exit 1
}

# Waits for node's loomrun; expects a failure within `limit` seconds whose log names `peer`.
expect_failure() {  # scenario node peer limit backend
  local pid status=0 started=$SECONDS
  pid=$(cat "$d/$1.node$2.pid")
  wait "$pid" || status=$?
  [ "$status" -ne 0 ] || { echo "$1: node $2's loomrun exited 0"; cat "$d/$1.node$2.log"; exit 1; }
  [ $((SECONDS - started)) -le "$4" ] || { echo "$1: node $2 took too long"; exit 1; }
  grep -m1 "\[comm/$5\] rank $2: peer $3 (host host$3) " "$d/$1.node$2.log" ||
    { echo "$1: node $2's log does not name peer $3 on host$3"; cat "$d/$1.node$2.log"; exit 1; }
  echo "$1: node $2's loomrun exited $status naming rank $3"
}

for backend in "${BACKENDS[@]}"; do
  start_nodes "cut-$backend" "$backend"
  ip -n "$prefix-sw" link set v1 down
  expect_failure "cut-$backend" 0 1 20 "$backend"
  expect_failure "cut-$backend" 1 0 20 "$backend"
  ip -n "$prefix-sw" link set v1 up

  start_nodes "kill-$backend" "$backend"
  kill -9 -- "-$(cat "$d/kill-$backend.node1.pid")"
  expect_failure "kill-$backend" 0 1 20 "$backend"
  wait 2>/dev/null || true
done

echo "a cut link and a killed host are named by the survivors within the timeout (${BACKENDS[*]})"
