#!/usr/bin/env bash
# train_gpt --strategy ddp over 2 hosts x 2 ranks: two network namespaces made by
# scripts/netns_hosts.sh, the ranks talking through the veth links. Against 4 ranks on one
# host over shm:
#   LAUNCHER loomrun: one loomrun on each host (--nnodes 2, the store on host 0)
#     - over each FLAT_BACKEND (tcp: Loom's own connections; ucx: UCX's TCP transport), flat,
#       rank-ordered reductions (Note [Rank-ordered reductions]): the saved model is the same
#       bytes;
#     - with 'auto', which picks the hierarchical backend for a group that spans hosts (shm
#       within each host, tcp between them), every step's loss is within 2e-4 (the sums are
#       associated by host: docs/multihost.md, "hierarchical");
#   LAUNCHER mpirun: Open MPI's mpirun from host 0 (its remote agent scripts/netns_rsh.sh
#     entering host 1's namespace; Loom reads the OMPI_* variables, rank 0 serves the store at
#     MASTER_ADDR), over the last FLAT_BACKEND: the same bytes again.
#   ddp_two_hosts.sh SOURCE_DIR LOOMRUN TRAIN_GPT loomrun|mpirun FLAT_BACKEND...
# Exit 77 (skipped, naming why) where the kernel refuses namespaces, or for mpirun where Open
# MPI is not installed; the skip ledger (tests/skips/ledger.toml) says where that is allowed.
set -euo pipefail
S=$1; LOOMRUN=$2; TRAIN_GPT=$3; LAUNCHER=$4; shift 4
BACKENDS=("$@")
[ ${#BACKENDS[@]} -gt 0 ] || { echo "ddp_two_hosts.sh: no FLAT_BACKEND given" >&2; exit 2; }
if [ "$LAUNCHER" = mpirun ] && ! command -v mpirun > /dev/null; then
  echo "mpirun: not installed (Debian: openmpi-bin): skipped"
  exit 77
fi
prefix="lm$(($$ % 100000))"
d=$(mktemp -d)
trap 'bash "$S/scripts/netns_hosts.sh" down "$prefix"; rm -rf "$d"' EXIT
bash "$S/scripts/netns_hosts.sh" up "$prefix" 2  # exits 77 where the kernel refuses
cfg=(--strategy ddp --layers 1 --heads 2 --embd 16 --ctx 16 --batch 2 --steps 3)
# Both nodes' loomrun must hand their ranks the same store secret.
LOOM_STORE_SECRET=$(od -An -tx1 -N32 /dev/urandom | tr -d ' \n')
export LOOM_STORE_SECRET

on_two_hosts() {  # backend name: saves $d/name.safetensors and $d/name.metrics
  local backend=$1 name=$2 pids=() node
  for node in 0 1; do
    ip netns exec "$prefix-h$node" env UCX_TLS=tcp timeout 120 "$LOOMRUN" --nnodes 2 \
      --node-rank "$node" --nproc-per-node 2 --master-addr 10.77.0.1 --master-port 29500 \
      "$TRAIN_GPT" "${cfg[@]}" --process-group-backend "$backend" \
      --save "$d/$name.safetensors" --metrics "$d/$name.metrics" > "$d/$name.node$node.log" 2>&1 &
    pids+=($!)
  done
  for node in 0 1; do
    wait "${pids[$node]}" || { echo "$name: node $node failed"; cat "$d/$name".node*.log; exit 1; }
  done
}

"$LOOMRUN" --nproc-per-node 4 --master-port 0 "$TRAIN_GPT" "${cfg[@]}" \
  --save "$d/one.safetensors" --metrics "$d/one.metrics" > "$d/one.log" 2>&1 ||
  { cat "$d/one.log"; exit 1; }
grep -q "backend shm" "$d/one.log" || { cat "$d/one.log"; exit 1; }

if [ "$LAUNCHER" = loomrun ]; then
  for backend in "${BACKENDS[@]}"; do
    on_two_hosts "$backend" "flat-$backend"
    grep -q "strategy ddp over 4 ranks (batch 2 per rank), backend $backend" "$d/flat-$backend.node0.log" ||
      { cat "$d/flat-$backend.node0.log"; exit 1; }
    cmp "$d/flat-$backend.safetensors" "$d/one.safetensors"
    echo "2 hosts x 2 ranks over $backend save the bytes 4 ranks on one host save"
  done

  on_two_hosts auto layered
  grep -q "backend hierarchical" "$d/layered.node0.log" || { cat "$d/layered.node0.log"; exit 1; }
  python3 - "$d/one.metrics" "$d/layered.metrics" <<'PY'
import json, sys
one, layered = ([json.loads(line)["loss"] for line in open(p)] for p in sys.argv[1:])
assert len(one) == len(layered) == 3, (one, layered)
worst = max(abs(a - b) for a, b in zip(one, layered))
print(f"hierarchical: losses {layered}, largest difference from one host {worst:.3g}")
assert worst <= 2e-4, f"hierarchical losses differ by {worst} (more than 2e-4)"
PY
  echo "2 hosts x 2 ranks over the hierarchical backend: losses within 2e-4 of one host"
  exit 0
fi

[ "$LAUNCHER" = mpirun ] || { echo "ddp_two_hosts.sh: unknown LAUNCHER '$LAUNCHER'" >&2; exit 2; }
backend=${BACKENDS[-1]}
ip netns exec "$prefix-h0" env NETNS_PREFIX="$prefix" timeout 120 mpirun --allow-run-as-root \
  --mca plm_rsh_agent "$S/scripts/netns_rsh.sh" --mca oob_tcp_if_include eth0 \
  --host 10.77.0.1:2,10.77.0.2:2 -np 4 -x MASTER_ADDR=10.77.0.1 -x MASTER_PORT=29500 \
  -x LOOM_STORE_SECRET -x UCX_TLS=tcp "$TRAIN_GPT" "${cfg[@]}" --process-group-backend "$backend" \
  --save "$d/mpirun.safetensors" > "$d/mpirun.log" 2>&1 || { cat "$d/mpirun.log"; exit 1; }
grep -q "strategy ddp over 4 ranks (batch 2 per rank), backend $backend" "$d/mpirun.log" ||
  { cat "$d/mpirun.log"; exit 1; }
cmp "$d/mpirun.safetensors" "$d/one.safetensors"
echo "2 hosts x 2 ranks started by mpirun over $backend: the same bytes again"
