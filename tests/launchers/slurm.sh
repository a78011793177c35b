#!/usr/bin/env bash
# Slurm on this machine: munged, slurmctld and slurmd of Debian's slurm-wlm, started from a
# private configuration in a temporary directory (the machine's /etc is not read or
# changed) and stopped at the end. Then `srun -n 2 train_gpt --strategy ddp` and `sbatch
# --wait` of a script that runs it: Loom reads SLURM_PROCID/SLURM_NTASKS/SLURM_LOCALID, rank
# 0 serves the store at MASTER_ADDR:MASTER_PORT, and both runs save loomrun's bytes.
# Skipped (exit 77, naming why) where Slurm or munge is not installed or its daemons do not
# come up; a failure of Loom under a running Slurm fails the test.
#   slurm.sh LOOMRUN TRAIN_GPT
set -euo pipefail
LOOMRUN=$1; TRAIN_GPT=$2
skip() { echo "slurm: $1: skipped"; exit 77; }
for tool in munged slurmctld slurmd srun sbatch sinfo; do
  command -v "$tool" > /dev/null || skip "$tool not installed (Debian: slurm-wlm, munge)"
done
[ "$(id -u)" -eq 0 ] || skip "the daemons need root"
d=$(mktemp -d)
stop() {  # the daemons, waiting until they are gone (at most 10 s), then their directory
  local pids=() file
  for file in "$d/slurmd.pid" "$d/slurmctld.pid" "$d/munge/pid"; do
    [ -f "$file" ] && pids+=("$(cat "$file")")
  done
  [ ${#pids[@]} -eq 0 ] || kill "${pids[@]}" 2> /dev/null || true
  for _ in $(seq 100); do
    kill -0 "${pids[@]}" 2> /dev/null || break
    sleep 0.1
  done
  rm -rf "$d"
}
trap stop EXIT
mkdir -p "$d/munge" "$d/spool/ctld" "$d/spool/d" "$d/log"
chmod 700 "$d/munge"
head -c 1024 /dev/urandom > "$d/munge/munge.key"
chmod 400 "$d/munge/munge.key"
munged --key-file "$d/munge/munge.key" --socket "$d/munge/socket" --pid-file "$d/munge/pid" \
  --log-file "$d/log/munged.log" --seed-file "$d/munge/seed" -f || skip "munged did not start"
host=$(hostname -s)
# Four ports of this run's own (slurmctld, slurmd, the two jobs' stores), below the kernel's
# ephemeral ports (32768 and up by default), which outgoing connections take: a store port
# chosen among them was once in use already (bind: Address already in use).
base=$((20000 + $$ % 3000 * 4))
cat > "$d/slurm.conf" << CONF
ClusterName=loomtest
SlurmctldHost=$host
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$d/munge/socket
CredType=cred/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SlurmctldPort=$base
SlurmdPort=$((base + 1))
SlurmctldPidFile=$d/slurmctld.pid
SlurmdPidFile=$d/slurmd.pid
SlurmdSpoolDir=$d/spool/d
StateSaveLocation=$d/spool/ctld
SlurmctldLogFile=$d/log/slurmctld.log
SlurmdLogFile=$d/log/slurmd.log
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
NodeName=$host CPUs=$(nproc) State=UNKNOWN
PartitionName=loom Nodes=$host Default=YES MaxTime=10 State=UP OverSubscribe=FORCE
CONF
export SLURM_CONF="$d/slurm.conf"
slurmctld -f "$SLURM_CONF" || skip "slurmctld did not start"
slurmd -f "$SLURM_CONF" || skip "slurmd did not start"
for _ in $(seq 100); do
  sinfo -h -o %T 2> /dev/null | grep -q idle && break
  sleep 0.2
done
sinfo -h -o %T 2> /dev/null | grep -q idle || skip "the node did not become idle"

cfg=(--strategy ddp --layers 1 --heads 2 --embd 16 --ctx 16 --batch 2 --steps 3)
LOOM_STORE_SECRET=$(od -An -tx1 -N32 /dev/urandom | tr -d ' \n')
export LOOM_STORE_SECRET
"$LOOMRUN" --nproc-per-node 2 --master-port 0 "$TRAIN_GPT" "${cfg[@]}" \
  --save "$d/loomrun.safetensors" > "$d/loomrun.log" 2>&1 || { cat "$d/loomrun.log"; exit 1; }

timeout 120 srun -n 2 --export="ALL,MASTER_ADDR=127.0.0.1,MASTER_PORT=$((base + 2))" \
  "$TRAIN_GPT" "${cfg[@]}" --save "$d/srun.safetensors" > "$d/srun.log" 2>&1 ||
  { cat "$d/srun.log"; exit 1; }
grep -q "strategy ddp over 2 ranks" "$d/srun.log" || { cat "$d/srun.log"; exit 1; }
cmp "$d/srun.safetensors" "$d/loomrun.safetensors"
echo "srun -n 2: loomrun's bytes"

cat > "$d/job.sh" << JOB
#!/bin/bash
srun --export=ALL,MASTER_ADDR=127.0.0.1,MASTER_PORT=$((base + 3)) "$TRAIN_GPT" ${cfg[*]} \
  --save "$d/sbatch.safetensors"
JOB
timeout 120 sbatch --wait -n 2 -o "$d/sbatch.log" --export=ALL "$d/job.sh" > /dev/null ||
  { cat "$d/sbatch.log"; exit 1; }
cmp "$d/sbatch.safetensors" "$d/loomrun.safetensors"
echo "sbatch of a script that runs srun: loomrun's bytes"
