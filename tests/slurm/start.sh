#!/usr/bin/env bash
# Start a SLURM cluster on this machine for the cluster tests: Debian's slurmctld, slurmd, slurm-client and munge.
# Two nodes, each its own slurmd (its own port, spool folder and log) on this one host: $host, with a fake `gpu` GRES
# (2 GPUs that are not there), alone in the default partition `debug`; and $host-2, which joins it in the partition
# `two` for the tests that span two nodes. Needs root; installs the packages when they are missing, writes
# /etc/slurm/slurm.conf and gres.conf, and /etc/munge/munge.key when there is none.
# Idempotent: a cluster that already answers is left alone. Prints why, and exits 0, when it cannot start
# one; the SLURM tests then skip with that reason. It stops no daemon it did not start. The PIDs of the daemons it
# starts go to $state/started.pids, from which the tests stop them, and the files it writes under /etc are put back
# as they were (tests/test_slurm.py: the slurm fixture): a slurm.conf left behind would make every later `scontrol`
# wait for a controller.
set -euo pipefail
state=${SLURM_TEST_STATE:-/tmp/slurm-test}
ready() { sinfo -h -o %T 2>/dev/null | grep -q -E "^(idle|mixed|allocated)"; }
mkdir -p "$state"
: > "$state/started.pids"; : > "$state/created.files"  # nothing of this run's to undo yet
if ready; then echo "SLURM already running"; exit 0; fi
if ! command -v slurmctld >/dev/null || ! command -v munged >/dev/null; then
  if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
    echo "SLURM is not installed and this user cannot install it (needs root and apt-get)"; exit 0
  fi
  export DEBIAN_FRONTEND=noninteractive
  packages="slurmctld slurmd slurm-client munge"  # the daemons and sbatch/squeue, without slurm-wlm's plugin recommends
  apt-get install -y -q --no-install-recommends $packages >/dev/null 2>&1 || { apt-get update -q >/dev/null && apt-get install -y -q --no-install-recommends $packages >/dev/null; }
fi
if [ "$(id -u)" != 0 ]; then echo "starting slurmd needs root"; exit 0; fi

host=$(hostname -s)
cpus=$(nproc)
mem=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 - 1024 ))
rm -rf "$state/backup"
mkdir -p "$state"/{ctld,slurmd-$host,slurmd-$host-2,log,backup} /etc/slurm /run/munge /var/log/munge /var/lib/munge
# What this script writes under /etc, so that the tests can put it back when they end: a file that was there is
# copied to $state/backup first, one that was not is listed in $state/created.files.
created="$state/created.files"
keep() { if [ -e "$1" ]; then cp -p "$1" "$state/backup/$(basename "$1")"; else echo "$1" >> "$created"; fi; }
keep /etc/slurm/slurm.conf
keep /etc/slurm/gres.conf
if [ ! -s /etc/munge/munge.key ]; then
  mkdir -p /etc/munge; dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 2>/dev/null
  echo /etc/munge/munge.key >> "$created"
fi
chown -R munge:munge /etc/munge /run/munge /var/log/munge /var/lib/munge 2>/dev/null || true
chmod 400 /etc/munge/munge.key
started="$state/started.pids"
if ! pgrep -x munged >/dev/null; then
  runuser -u munge -- munged 2>/dev/null || munged --force
  sleep 0.5; pgrep -x munged >> "$started" || true
fi

cat > /etc/slurm/slurm.conf <<CONF
ClusterName=local
SlurmctldHost=$host
SlurmUser=root
AuthType=auth/munge
StateSaveLocation=$state/ctld
SlurmdSpoolDir=$state/slurmd-%n
SlurmctldPidFile=$state/slurmctld.pid
SlurmdPidFile=$state/slurmd-%n.pid
SlurmctldLogFile=$state/log/slurmctld.log
SlurmdLogFile=$state/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
GresTypes=gpu
ReturnToService=2
MinJobAge=3600
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
SchedulerParameters=sched_interval=1
NodeName=$host NodeAddr=127.0.0.1 Port=6818 CPUs=$cpus RealMemory=$mem Gres=gpu:2 State=UNKNOWN
NodeName=$host-2 NodeHostname=$host NodeAddr=127.0.0.1 Port=6819 CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP
PartitionName=two Nodes=$host,$host-2 MaxTime=INFINITE State=UP
CONF
# Two stand-in device files: slurmd counts a gpu GRES by its File entries.
for i in 0 1; do [ -e "$state/gpu$i" ] || mknod "$state/gpu$i" c 1 3 2>/dev/null || touch "$state/gpu$i"; done
cat > /etc/slurm/gres.conf <<CONF
AutoDetect=off
NodeName=$host Name=gpu File=$state/gpu[0-1]
CONF
# The daemon named $1 whose PID file $2 (in $state, so written by a daemon this script started) names, if it runs.
ours() { local pid; pid=$(cat "$2" 2>/dev/null) || return 1; [ "$(ps -o comm= -p "$pid" 2>/dev/null)" = "$1" ] && echo "$pid"; }
# Daemons an earlier run of this script started and left behind (not answering, or `ready` would have said so)
# are stopped by their PID; daemons of anyone else are left alone (slurmctld then cannot start and says why).
pidfiles="slurmd:$state/slurmd-$host.pid slurmd:$state/slurmd-$host-2.pid slurmctld:$state/slurmctld.pid"
for entry in $pidfiles; do
  daemon=${entry%%:*}; file=${entry#*:}
  if pid=$(ours "$daemon" "$file"); then
    kill "$pid"
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
  fi
  rm -f "$file"
done
slurmctld -c -i || echo "slurmctld did not start"
sleep 1
for node in "$host" "$host-2"; do slurmd -N "$node" || echo "slurmd of $node did not start"; done
sleep 0.5
for entry in $pidfiles; do ours "${entry%%:*}" "${entry#*:}" >> "$started" || true; done
for _ in $(seq 30); do
  if [ "$(sinfo -h -N -o %T | grep -c -E '^(idle|mixed|allocated)')" -ge 2 ]; then sinfo; exit 0; fi
  sleep 1
done
echo "SLURM did not come up; see $state/log"; tail -n 5 "$state"/log/*.log; exit 0
