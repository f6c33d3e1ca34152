#!/usr/bin/env bash
# Start a real Slurm cluster on this machine for the tests: munge, MariaDB + slurmdbd (accounting,
# so sacct and submitit see true job states), slurmctld, and one slurmd per node.
#
# Every node is a slurmd in its own UTS namespace (hostname node1, node2, ...) listening on its own
# port of a loopback address 127.0.2.N, so jobs see distinct node names and all traffic stays on
# this machine. Nodes advertise stand-in GPUs as GRES, so GPU scripts can be scheduled; the jobs
# themselves find no GPU and run on CPU with gloo.
#
# Idempotent: when the recorded daemons are alive and the nodes answer, it only says so.
# Knobs: LOCAL_SLURM_DIR (state, logs, pids; default <repo>/.local-slurm), LOCAL_SLURM_NODES (2).
# Stop with tests/slurm/stop.sh, which stops exactly the processes recorded here.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
: "${LOCAL_SLURM_DIR:=$repo/.local-slurm}"
: "${LOCAL_SLURM_NODES:=2}"
: "${LOCAL_SLURM_GPUS:=8}"
DIR=$LOCAL_SLURM_DIR
CLUSTER=reproflowtest
SIGNATURE="nodes=$LOCAL_SLURM_NODES gpus=$LOCAL_SLURM_GPUS dir=$DIR"

say() { printf 'local-slurm: %s\n' "$*"; }

alive() {  # a recorded pid that is running and not a zombie
    local pid=$1 state
    [ -r "/proc/$pid/stat" ] || return 1
    state=$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null) || return 1
    [ "$state" != Z ]
}

all_alive() {
    [ -s "$DIR/daemons" ] && [ "$(cat "$DIR/signature" 2>/dev/null)" = "$SIGNATURE" ] || return 1
    while read -r _ pid; do alive "$pid" || return 1; done < "$DIR/daemons"
    timeout 5 scontrol ping >/dev/null 2>&1 || return 1
    [ "$(sinfo -h -o '%T' 2>/dev/null | grep -cE '^(idle|mixed|allocated)')" -ge 1 ]
}

if command -v scontrol >/dev/null && all_alive; then
    say "already running ($SIGNATURE)"
    exit 0
fi
[ -s "$DIR/daemons" ] && bash "$here/stop.sh" >/dev/null 2>&1 || true
# A controller this script did not start (another checkout's test cluster, or a real one) holds the
# ports and /etc/slurm: say so instead of failing half-way.
if command -v scontrol >/dev/null && timeout 5 scontrol ping 2>/dev/null | grep -q UP; then
    say "a Slurm controller not started from $DIR is already running ($(timeout 5 scontrol ping | head -1))."
    say "stop it first (for another checkout's test cluster: LOCAL_SLURM_DIR=<its .local-slurm> tests/slurm/stop.sh)."
    exit 1
fi

# 1. Packages (Debian's): slurmctld, slurmd, slurmdbd, munge, MariaDB.
need=()
for pkg in slurm-wlm slurmdbd munge mariadb-server; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || need+=("$pkg")
done
if [ ${#need[@]} -gt 0 ]; then
    say "installing ${need[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null
    apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

mkdir -p "$DIR"/{log,pids,spool,ctld}
rm -rf "${DIR:?}"/ctld/* "${DIR:?}"/spool/* "${DIR:?}"/log/*
: > "$DIR/daemons"
record() { echo "$1 $2" >> "$DIR/daemons"; }

wait_for() {  # wait_for SECONDS DESCRIPTION COMMAND...
    local limit=$1 what=$2; shift 2
    local end=$((SECONDS + limit))
    until "$@" >/dev/null 2>&1; do
        if [ $SECONDS -ge $end ]; then say "timed out waiting for $what; logs in $DIR/log"; exit 1; fi
        sleep 0.2
    done
}

pidfile_pid() { wait_for 20 "$1" test -s "$1"; cat "$1"; }

# 2. Node names resolve to their loopback addresses.
sed -i '/# local-slurm$/d' /etc/hosts
for i in $(seq 1 "$LOCAL_SLURM_NODES"); do echo "127.0.2.$i node$i # local-slurm" >> /etc/hosts; done

# 3. munge: one key, one daemon; its socket is shared by every "node".
if [ ! -s /etc/munge/munge.key ]; then
    dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
fi
chown munge:munge /etc/munge/munge.key && chmod 400 /etc/munge/munge.key
mkdir -p /run/munge /var/log/munge /var/lib/munge
chown munge:munge /run/munge /var/log/munge /var/lib/munge
rm -f /run/munge/munged.pid
runuser -u munge -- /usr/sbin/munged --force
record munged "$(pidfile_pid /run/munge/munged.pid)"

# 4. Accounting: MariaDB on 127.0.0.1 and slurmdbd.
mkdir -p /run/mysqld && chown mysql:mysql /run/mysqld
if ! timeout 5 mariadb-admin --socket=/run/mysqld/mysqld.sock ping >/dev/null 2>&1; then
    nohup mariadbd --user=mysql --bind-address=127.0.0.1 --port=3306 --socket=/run/mysqld/mysqld.sock \
        --pid-file=/run/mysqld/local-slurm.pid --innodb-buffer-pool-size=64M \
        >"$DIR/log/mariadb.log" 2>&1 &
    record mariadbd $!
    wait_for 60 MariaDB mariadb-admin --socket=/run/mysqld/mysqld.sock ping
fi
# A fresh accounting database per start: job ids may restart, and sacct must not mix old jobs in.
mariadb --socket=/run/mysqld/mysqld.sock -e "
    DROP DATABASE IF EXISTS ${CLUSTER}_acct;
    CREATE DATABASE ${CLUSTER}_acct;
    CREATE OR REPLACE USER 'slurm'@'localhost' IDENTIFIED BY 'slurm';
    GRANT ALL ON ${CLUSTER}_acct.* TO 'slurm'@'localhost';"

mkdir -p /etc/slurm
cat > /etc/slurm/slurmdbd.conf <<EOF
AuthType=auth/munge
DbdHost=localhost
DbdAddr=127.0.0.1
DbdPort=6819
SlurmUser=root
DebugLevel=info
LogFile=$DIR/log/slurmdbd.log
PidFile=$DIR/pids/slurmdbd.pid
StorageType=accounting_storage/mysql
StorageHost=localhost
StorageUser=slurm
StoragePass=slurm
StorageLoc=${CLUSTER}_acct
EOF
chmod 600 /etc/slurm/slurmdbd.conf
rm -f "$DIR/pids/slurmdbd.pid"
slurmdbd
record slurmdbd "$(pidfile_pid "$DIR/pids/slurmdbd.pid")"
# slurmctld gives up at once when slurmdbd does not answer yet.
wait_for 60 slurmdbd sacctmgr -n show cluster

# 5. slurm.conf: job ids continue across restarts so stale submitit folders never match.
first_job=$(cat "$DIR/next_job_id" 2>/dev/null || echo 1)
cpus=$(nproc)
mem=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 / LOCAL_SLURM_NODES / 2 ))
{
    cat <<EOF
ClusterName=$CLUSTER
SlurmctldHost=$(hostname -s)(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
SlurmctldPort=6817
StateSaveLocation=$DIR/ctld
SlurmdSpoolDir=$DIR/spool/%n
SlurmctldPidFile=$DIR/pids/slurmctld.pid
SlurmdPidFile=$DIR/pids/slurmd-%n.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
MailProg=/bin/true
SwitchType=switch/none
MpiDefault=none
ReturnToService=2
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
GresTypes=gpu
InactiveLimit=0
KillWait=5
OverTimeLimit=0
MinJobAge=4
JobRequeue=0
FirstJobId=$first_job
Waittime=0
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
AccountingStoragePort=6819
JobAcctGatherType=jobacct_gather/linux
JobAcctGatherFrequency=30
EOF
    for i in $(seq 1 "$LOCAL_SLURM_NODES"); do
        echo "NodeName=node$i NodeHostname=node$i NodeAddr=127.0.2.$i Port=$((17000 + i)) CPUs=$cpus RealMemory=$mem Gres=gpu:$LOCAL_SLURM_GPUS State=UNKNOWN"
    done
    echo "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP"
} > /etc/slurm/slurm.conf
# Stand-in GPUs: character devices with /dev/null's numbers, so the GPU scripts can be scheduled
# (Slurm needs a device file per GPU). Jobs find no real GPU and run on CPU.
mkdir -p "$DIR/fake-gpu"
for g in $(seq 0 $((LOCAL_SLURM_GPUS - 1))); do
    [ -c "$DIR/fake-gpu/gpu$g" ] || mknod "$DIR/fake-gpu/gpu$g" c 1 3
done
echo "Name=gpu File=$DIR/fake-gpu/gpu[0-$((LOCAL_SLURM_GPUS - 1))]" > /etc/slurm/gres.conf
echo "$SIGNATURE" > "$DIR/signature"

# 6. Controller.
slurmctld
record slurmctld "$(pidfile_pid "$DIR/pids/slurmctld.pid")"
wait_for 30 slurmctld scontrol ping

# 7. Nodes: each slurmd in its own UTS namespace, so `hostname` inside a job is the node name.
for i in $(seq 1 "$LOCAL_SLURM_NODES"); do
    unshare --uts sh -c "hostname node$i && exec slurmd -N node$i"
    record "slurmd-node$i" "$(pidfile_pid "$DIR/pids/slurmd-node$i.pid")"
done
idle() { [ "$(sinfo -h -N -o '%T' | grep -c '^idle')" -eq "$LOCAL_SLURM_NODES" ]; }
wait_for 30 "idle nodes" idle
clustered() { sacctmgr -n -P show cluster format=cluster | grep -qx "$CLUSTER"; }
wait_for 30 "accounting registration" clustered
say "up: $LOCAL_SLURM_NODES nodes, accounting on; state in $DIR"
sinfo
