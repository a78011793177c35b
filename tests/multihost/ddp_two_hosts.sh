#!/usr/bin/env bash
# train_gpt --strategy ddp over 2 hosts x 2 ranks: two network namespaces made by
# scripts/netns_hosts.sh, one loomrun on each (--nnodes 2, the store on host 0), the ranks
# talking over UCX's TCP transport through the veth links. The group spans hosts, so 'auto'
# picks the ucx backend; its reductions are rank-ordered (Note [Rank-ordered reductions]),
# so the saved model must be bitwise the one 4 ranks on one host save over shm.
#   ddp_two_hosts.sh SOURCE_DIR LOOMRUN TRAIN_GPT      (exit 77: namespaces refused, skip)
set -euo pipefail
S=$1; LOOMRUN=$2; TRAIN_GPT=$3
prefix="lm$(($$ % 100000))"
d=$(mktemp -d)
trap 'bash "$S/scripts/netns_hosts.sh" down "$prefix"; rm -rf "$d"' EXIT
bash "$S/scripts/netns_hosts.sh" up "$prefix" 2  # exits 77 where the kernel refuses
cfg=(--layers 1 --heads 2 --embd 16 --ctx 16 --batch 2 --steps 3)
# Both nodes' loomrun must hand their ranks the same store secret.
LOOM_STORE_SECRET=$(od -An -tx1 -N32 /dev/urandom | tr -d ' \n')
export LOOM_STORE_SECRET
pids=()
for node in 0 1; do
  ip netns exec "$prefix-h$node" env UCX_TLS=tcp timeout 120 "$LOOMRUN" --nnodes 2 \
    --node-rank "$node" --nproc-per-node 2 --master-addr 10.77.0.1 --master-port 29500 \
    "$TRAIN_GPT" --strategy ddp "${cfg[@]}" --save "$d/hosts.safetensors" > "$d/node$node.log" 2>&1 &
  pids+=($!)
done
for node in 0 1; do
  wait "${pids[$node]}" || { echo "node $node failed:"; cat "$d/node0.log" "$d/node1.log"; exit 1; }
done
grep -q "strategy ddp over 4 ranks (batch 2 per rank), backend ucx" "$d/node0.log" ||
  { cat "$d/node0.log"; exit 1; }
grep "step 3/3" "$d/node0.log"
"$LOOMRUN" --nproc-per-node 4 --master-port 0 "$TRAIN_GPT" --strategy ddp "${cfg[@]}" \
  --save "$d/one.safetensors" > "$d/one.log" 2>&1 || { cat "$d/one.log"; exit 1; }
grep -q "backend shm" "$d/one.log" || { cat "$d/one.log"; exit 1; }
cmp "$d/hosts.safetensors" "$d/one.safetensors"
echo "2 hosts x 2 ranks over ucx save the bytes 4 ranks on one host save over shm"
