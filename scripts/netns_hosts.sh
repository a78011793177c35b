#!/usr/bin/env bash
# Test "hosts" on one machine: network namespaces PREFIX-h0 .. PREFIX-h{N-1}, each with an
# eth0 at 10.77.0.(k+1)/24, joined by a bridge in a namespace of its own (PREFIX-sw). Links
# are created inside the namespaces, so nothing is added to the machine's own network and
# traffic between the hosts stays on the veth pairs and the bridge.
#   scripts/netns_hosts.sh up PREFIX N      make them (PREFIX: a few letters, unique per run)
#   scripts/netns_hosts.sh down PREFIX      remove every namespace PREFIX-* (safe to repeat)
#   ip netns exec PREFIX-h1 COMMAND         run COMMAND on host 1
# Needs root. Exits 77 (ctest's skip code) naming the reason when the kernel refuses
# network namespaces, veth pairs or bridges.
set -euo pipefail

usage() { echo "usage: $0 up PREFIX N | down PREFIX" >&2; exit 2; }

down() {
  local prefix=$1 ns
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}'); do
    case "$ns" in "$prefix"-h* | "$prefix"-sw) ip netns del "$ns" 2>/dev/null || true ;; esac
  done
}

refused() {
  echo "netns_hosts: $1; test hosts need root and a kernel that allows network namespaces" >&2
  down "$2"
  exit 77
}

up() {
  local prefix=$1 n=$2 k answer
  [ ${#prefix} -le 8 ] || { echo "netns_hosts: PREFIX '$prefix' is longer than 8 characters" >&2; exit 2; }
  [ "$n" -ge 1 ] && [ "$n" -le 200 ] || { echo "netns_hosts: N must be 1 to 200, got '$n'" >&2; exit 2; }
  [ "$(id -u)" -eq 0 ] || refused "not root" "$prefix"
  ip netns add "$prefix-sw" 2>/dev/null || refused "'ip netns add' failed" "$prefix"
  ip -n "$prefix-sw" link set lo up
  ip -n "$prefix-sw" link add br0 type bridge 2>/dev/null || refused "no bridge device" "$prefix"
  ip -n "$prefix-sw" link set br0 up
  for ((k = 0; k < n; ++k)); do
    ip netns add "$prefix-h$k"
    ip -n "$prefix-h$k" link set lo up
    ip -n "$prefix-sw" link add "v$k" type veth peer name eth0 netns "$prefix-h$k" 2>/dev/null ||
      refused "no veth pairs" "$prefix"
    ip -n "$prefix-sw" link set "v$k" master br0 up
    ip -n "$prefix-h$k" addr add "10.77.0.$((k + 1))/24" dev eth0
    ip -n "$prefix-h$k" link set eth0 up
  done
  # The bridge forwards once its ports are up: wait until host 0 reaches the last host (a
  # connection to a closed port there is refused, which takes an answer from that host).
  for ((k = 0; k < 50; ++k)); do
    answer=$(ip netns exec "$prefix-h0" timeout 1 bash -c "echo > /dev/tcp/10.77.0.$n/9" 2>&1 || true)
    [[ "$answer" == *refused* ]] && return 0
    sleep 0.1
  done
  echo "netns_hosts: host 0 cannot reach 10.77.0.$n through the bridge" >&2
  [ -n "${NETNS_KEEP:-}" ] || down "$prefix"
  exit 1
}

case "${1:-}" in
  up) [ $# -eq 3 ] || usage; up "$2" "$3" ;;
  down) [ $# -eq 2 ] || usage; down "$2" ;;
  *) usage ;;
esac
