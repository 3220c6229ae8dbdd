#!/usr/bin/env bash
# Start a real single-host Slurm cluster from Debian's packages: munged, MariaDB, slurmdbd
# (accounting, fair-share), slurmctld and one slurmd per emulated node, all as root without
# systemd, every daemon with its own PID file under the state directory (stop: down.sh).
#
#   NODES=3 STATE=/tmp/tbhpc-slurm bash slurm/local/up.sh
#   . /tmp/tbhpc-slurm/env.sh        # SLURM_CONF for sbatch/squeue/sacct in your shell
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
NODES=${NODES:-3}
STATE=${STATE:-/tmp/tbhpc-slurm}
CPUS=${CPUS_PER_NODE:-2}
bash "$here/install.sh"
if [ -f "$STATE/run/slurmctld.pid" ] && kill -0 "$(cat "$STATE/run/slurmctld.pid")" 2>/dev/null; then
  echo "slurm/local: already running ($STATE)"; exit 0
fi
mkdir -p "$STATE"/{etc,run,log,ctld,spool,mysql,munge}
chmod 755 "$STATE"
export SLURM_CONF="$STATE/etc/slurm.conf"

# --- munge (runs as the munge user; Slurm's auth plugin talks to /run/munge) ---------------
mkdir -p /run/munge && chown munge:munge /run/munge && chmod 755 /run/munge
chown munge:munge "$STATE/munge"
[ -f "$STATE/munge/munge.key" ] || { dd if=/dev/urandom of="$STATE/munge/munge.key" bs=1024 count=1 status=none; }
chown munge:munge "$STATE/munge/munge.key"; chmod 400 "$STATE/munge/munge.key"
runuser -u munge -- /usr/sbin/munged --key-file="$STATE/munge/munge.key" --pid-file="$STATE/munge/munged.pid" \
  --log-file="$STATE/munge/munged.log" --seed-file="$STATE/munge/munged.seed" --force

# --- MariaDB on 127.0.0.1, data under the state dir -----------------------------------------
if [ ! -d "$STATE/mysql/mysql" ]; then
  mariadb-install-db --user=root --datadir="$STATE/mysql" --auth-root-authentication-method=socket >/dev/null
fi
/usr/sbin/mariadbd --user=root --datadir="$STATE/mysql" --socket="$STATE/run/mysql.sock" --port=13306 \
  --bind-address=127.0.0.1 --pid-file="$STATE/run/mariadb.pid" --log-error="$STATE/log/mariadb.log" \
  --skip-name-resolve >/dev/null 2>&1 &
for _ in $(seq 100); do mariadb -S "$STATE/run/mysql.sock" -e 'select 1' >/dev/null 2>&1 && break; sleep 0.2; done
mariadb -S "$STATE/run/mysql.sock" -e "CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY 'tbhpc';
  CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY 'tbhpc';
  GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost'; GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';"

# --- configs ---------------------------------------------------------------------------------
cat > "$STATE/etc/slurmdbd.conf" <<CONF
AuthType=auth/munge
DbdHost=localhost
DbdAddr=127.0.0.1
DbdPort=16819
SlurmUser=root
PidFile=$STATE/run/slurmdbd.pid
LogFile=$STATE/log/slurmdbd.log
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=13306
StorageUser=slurm
StoragePass=tbhpc
StorageLoc=slurm_acct_db
CONF
chmod 600 "$STATE/etc/slurmdbd.conf"
last=$((17000 + NODES))
cat > "$STATE/etc/slurm.conf" <<CONF
ClusterName=tbhpc
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort=16817
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=cred_expire=10
CredType=cred/munge
CommunicationParameters=NoInAddrAny,NoCtldInAddrAny
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$STATE/spool/%n
TmpFS=$STATE/tmp/%n
SlurmctldPidFile=$STATE/run/slurmctld.pid
SlurmdPidFile=$STATE/run/slurmd-%n.pid
SlurmctldLogFile=$STATE/log/slurmctld.log
SlurmdLogFile=$STATE/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
ReturnToService=2
SwitchType=switch/none
SchedulerType=sched/backfill
SchedulerParameters=batch_sched_delay=0,sched_min_interval=0,bf_interval=1
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
JobRequeue=1
KillWait=5
MinJobAge=300
InactiveLimit=0
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
AccountingStoragePort=16819
AccountingStorageEnforce=associations
PriorityType=priority/multifactor
PriorityWeightFairshare=100000
PriorityWeightAge=0
PriorityWeightJobSize=0
PriorityWeightPartition=0
PriorityWeightQOS=0
PriorityDecayHalfLife=1-0
PriorityCalcPeriod=1
PriorityUsageResetPeriod=NONE
PreemptType=preempt/partition_prio
PreemptMode=REQUEUE
NodeName=node[1-$NODES] NodeAddr=127.0.0.1 Port=[17001-$last] CPUs=$CPUS RealMemory=4000 State=UNKNOWN
PartitionName=batch Nodes=node[1-$NODES] Default=YES MaxTime=INFINITE State=UP PriorityTier=1
PartitionName=high Nodes=node[1-$NODES] MaxTime=INFINITE State=UP PriorityTier=10
CONF
# emulated nodes share one host: keep Open MPI off its shared-memory transport between "nodes"
printf 'export SLURM_CONF=%s\nexport OMPI_MCA_btl=self,tcp\n' "$SLURM_CONF" > "$STATE/env.sh"

# --- daemons -----------------------------------------------------------------------------------
/usr/sbin/slurmdbd   # reads slurmdbd.conf next to $SLURM_CONF
for _ in $(seq 100); do sacctmgr -n list cluster >/dev/null 2>&1 && break; sleep 0.2; done
sacctmgr -i add cluster tbhpc >/dev/null 2>&1 || true
sacctmgr -i add account acct_a,acct_b Description=tbhpc Organization=tbhpc >/dev/null 2>&1 || true
sacctmgr -i add user root Account=acct_a,acct_b DefaultAccount=acct_a >/dev/null 2>&1 || true
/usr/sbin/slurmctld -f "$SLURM_CONF"
for i in $(seq 1 "$NODES"); do
  mkdir -p "$STATE/spool/node$i" "$STATE/tmp/node$i"
  /usr/sbin/slurmd -f "$SLURM_CONF" -N "node$i"
done
for _ in $(seq 150); do
  idle=$(sinfo -h -p batch -t idle -o '%D' 2>/dev/null | head -1)
  [ "${idle:-0}" = "$NODES" ] && break
  sleep 0.2
done
sinfo -h -p batch -t idle -o '%D' | grep -qx "$NODES" || { echo "slurm/local: nodes did not come up; see $STATE/log" >&2; exit 1; }
echo "slurm/local: $NODES nodes up; . $STATE/env.sh"
