#!/usr/bin/env bash
# Open MPI's remote agent for the test hosts of scripts/netns_hosts.sh: mpirun calls it as
# `netns_rsh.sh [options] HOST COMMAND...` instead of ssh; it runs COMMAND inside the host's
# namespace. HOST is a test host's address, 10.77.0.(k+1) for PREFIX-hk; NETNS_PREFIX names
# the prefix (mpirun passes the environment on with -x or in its own launch).
#   mpirun --mca plm_rsh_agent scripts/netns_rsh.sh --host 10.77.0.1:2,10.77.0.2:2 ...
set -euo pipefail
while [[ "${1:-}" == -* ]]; do shift; done  # ssh options Open MPI may add (-x, -T, ...)
host=$1; shift
case "$host" in
  10.77.0.*) k=$(( ${host##*.} - 1 )) ;;
  *) echo "netns_rsh: '$host' is not a test host (10.77.0.N)" >&2; exit 255 ;;
esac
exec ip netns exec "${NETNS_PREFIX:?netns_rsh: set NETNS_PREFIX to the prefix of the test hosts}-h$k" \
  bash -c "$*"
