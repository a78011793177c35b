#!/usr/bin/env bash
# Allreduce between two test hosts (scripts/netns_hosts.sh), interleaved, several rounds:
#   1 rank per host:  loom-perf --backend ucx and --backend tcp (-z 0, and -z 1: synchronous
#                     calls, as Open MPI's blocking MPI_Allreduce)  against  Open MPI (btl
#                     tcp,self) and Gloo (TCP)
#   2 ranks per host: loom-perf --backend ucx, tcp and hierarchical  against  both
# Every program is started by mpirun from host 0 (scripts/netns_rsh.sh as its remote agent)
# with --bind-to none: Open MPI's default binding pins rank 0 of each "host" to the same
# core, which on one machine puts the ranks of both hosts on one core; with one rank per host
# the script pins rank r to core r itself (taskset). Loom uses UCX_TLS=tcp,
# so both sides cross the veth links over TCP. Loom and Open MPI take turns going first. Prints,
# per program and size, the us per call of every round and their median, then
# Loom's ucx and tcp (-z 0 and -z 1) over Open MPI within each round and the median ratio, out of
# place (Open MPI's MPI_Allreduce copies the input to the output first) and in place. Needs
# root, Open MPI and a build with UCX;
# Gloo's peer (bench/peers/gloo_allreduce_perf, Debian libgloo-dev) runs where it was built,
# its ranks meeting through a FileStore in a shared directory and listening on eth0; where it
# was not, its rows are skipped with a message.
#   bench/comm/multihost_allreduce.sh [ROUNDS]      (from the repository root; default 3)
# TCP_CC=NAME sets the test hosts' TCP congestion control (a network namespace may choose
# only those in /proc/sys/net/ipv4/tcp_allowed_congestion_control); without it they keep the
# machine's, which the script prints. It matters here: docs/performance_comm.md, "2026-11-28:
# the hosts' congestion control, pieces, and yielding".
# SIZES="-b 1M -e 4M -f 4 -n 200 -w 20" replaces the two sweeps of one rank per host with
# one of these loom-perf/mpi_allreduce_perf arguments; ONE_PER_HOST=1 skips Gloo and the runs
# of 2 ranks per host (a quick look at one rank per host against Open MPI).
set -euo pipefail
rounds=${1:-3}
B=build/release
prefix="mb$(($$ % 100000))"
trap 'bash scripts/netns_hosts.sh down "$prefix"' EXIT
bash scripts/netns_hosts.sh up "$prefix" 2
if [ -n "${TCP_CC:-}" ]; then
  for host in 0 1; do
    ip netns exec "$prefix-h$host" sysctl -qw net.ipv4.tcp_congestion_control="$TCP_CC" || {
      echo "cannot set TCP_CC=$TCP_CC on the test hosts; a namespace may choose one of:" \
        "$(cat /proc/sys/net/ipv4/tcp_allowed_congestion_control)" >&2
      exit 2
    }
  done
fi
echo "TCP congestion control on the test hosts: $(ip netns exec "$prefix-h0" sysctl -n net.ipv4.tcp_congestion_control)"
LOOM_STORE_SECRET=$(od -An -tx1 -N32 /dev/urandom | tr -d ' \n')
export LOOM_STORE_SECRET
out=$(mktemp -d)

run() {  # label ranks-per-host program args...: appends "label size us" lines
  local label=$1 per_host=$2
  shift 2
  # One rank per host: each rank on a core of its own, as on real hosts (mpirun's own binding
  # would put both on core 0, see above). Unbound, the scheduler at times started both ranks'
  # busy threads on one core and moved one only milliseconds later, which made the first size
  # of a loom-perf -z 0 sweep (its progress thread polls) 3x to 4x slow in some rounds.
  if [ "$per_host" -eq 1 ]; then set -- bash -c 'exec taskset -c "$((OMPI_COMM_WORLD_RANK % $(nproc)))" "$0" "$@"' "$@"; fi
  ip netns exec "$prefix-h0" env NETNS_PREFIX="$prefix" timeout 600 mpirun --allow-run-as-root \
    --bind-to none --mca plm_rsh_agent "$PWD/scripts/netns_rsh.sh" --mca oob_tcp_if_include eth0 \
    --mca btl tcp,self --mca btl_tcp_if_include eth0 \
    --host "10.77.0.1:$per_host,10.77.0.2:$per_host" -np $((2 * per_host)) \
    -x MASTER_ADDR=10.77.0.1 -x MASTER_PORT=29500 -x LOOM_STORE_SECRET -x UCX_TLS=tcp "$@" 2>&1 |
    awk -v l="$label" -v r="$round" \
      '/^ +[0-9]+ +[0-9]+ +float/ {print r, l, $1, $6; if ($10 ~ /^[0-9.]+$/) print r, l " in-place", $1, $10}' >> "$out/results"
}

gloo() {  # ranks-per-host args...
  local per_host=$1 store
  shift
  [ -x "$B/bench/peers/gloo_allreduce_perf" ] || return 0 # said once, above the rounds
  store=$(mktemp -d)
  run "gloo ${per_host}x2" "$per_host" "$B/bench/peers/gloo_allreduce_perf" --store-dir "$store" \
    --iface eth0 "$@"
  rm -rf "$store"
}

small=(-b 8 -e 32K -f 8 -n 1000 -w 50)
medium=(-b 64K -e 16M -f 4 -n 100 -w 10)
large=(-b 1M -e 16M -f 4 -n 20 -w 3)
sweeps=(small medium)
if [ -n "${SIZES:-}" ]; then
  read -r -a custom <<< "$SIZES"
  sweeps=(custom)
fi
one_per_host=${ONE_PER_HOST:-0}
if [ "$one_per_host" != 1 ] && [ ! -x "$B/bench/peers/gloo_allreduce_perf" ]; then
  echo "skipping Gloo: $B/bench/peers/gloo_allreduce_perf is not built" \
    "(apt-get install -y libgloo-dev, then configure and build again)" >&2
fi
# Loom and Open MPI take turns going first (the host's fast and slow modes last seconds).
for ((round = 1; round <= rounds; ++round)); do
  echo "round $round" >&2
  for sizes in "${sweeps[@]}"; do
    declare -n args=$sizes
    ucx_1x2() {
      run "ucx 1x2" 1 "$B/tools/loom_perf/loom-perf" allreduce --backend ucx "${args[@]}"
      run "ucx-z1 1x2" 1 "$B/tools/loom_perf/loom-perf" allreduce --backend ucx "${args[@]}" -z 1
      run "tcp 1x2" 1 "$B/tools/loom_perf/loom-perf" allreduce --backend tcp "${args[@]}"
      run "tcp-z1 1x2" 1 "$B/tools/loom_perf/loom-perf" allreduce --backend tcp "${args[@]}" -z 1
    }
    mpi_1x2() { run "mpi 1x2" 1 "$B/bench/peers/mpi_allreduce_perf" "${args[@]}"; }
    if ((round % 2)); then ucx_1x2; mpi_1x2; else mpi_1x2; ucx_1x2; fi
    [ "$one_per_host" = 1 ] || gloo 1 "${args[@]}"
  done
  if [ "$one_per_host" = 1 ]; then continue; fi
  run "ucx 2x2" 2 "$B/tools/loom_perf/loom-perf" allreduce --backend ucx "${large[@]}"
  run "tcp 2x2" 2 "$B/tools/loom_perf/loom-perf" allreduce --backend tcp "${large[@]}"
  run "hierarchical 2x2" 2 "$B/tools/loom_perf/loom-perf" allreduce --backend hierarchical "${large[@]}"
  run "mpi 2x2" 2 "$B/bench/peers/mpi_allreduce_perf" "${large[@]}"
  gloo 2 "${large[@]}"
done
python3 - "$out/results" <<'PY'
import collections, statistics, sys
runs = collections.defaultdict(dict)  # (label, size) -> {round: us}
for line in open(sys.argv[1]):
    rnd, *label, size, us = line.split()
    runs[(" ".join(label), int(size))][int(rnd)] = float(us)
for (label, size), by_round in sorted(runs.items(), key=lambda kv: (kv[0][0].split()[-1], kv[0][1], kv[0][0])):
    values = [by_round[r] for r in sorted(by_round)]
    print(f"{label:27s} {size:>9d} B  median {statistics.median(values):10.2f} us  runs {', '.join(f'{v:.2f}' for v in values)}")
# Loom's ucx and tcp against Open MPI, one rank per host, out of place and in place: the ratio
# within each round, and its median.
for (label, size), by_round in sorted(runs.items(), key=lambda kv: (kv[0][1], kv[0][0])):
    where = " in-place" if label.endswith(" in-place") else ""
    peer = runs.get(("mpi 1x2" + where, size))
    if label.removesuffix(where) not in ("ucx 1x2", "ucx-z1 1x2", "tcp 1x2", "tcp-z1 1x2") or not peer:
        continue
    ratios = [by_round[r] / peer[r] for r in sorted(by_round) if r in peer]
    name = label.replace(" 1x2", "") + " / mpi"
    print(f"{name:24s} {size:>9d} B  median {statistics.median(ratios):5.2f}  rounds {', '.join(f'{x:.2f}' for x in ratios)}")
PY
rm -rf "$out"
