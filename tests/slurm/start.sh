#!/usr/bin/env bash
# Start a real Slurm cluster on this machine for the tests: munge, MariaDB + slurmdbd (accounting,
# so sacct and submitit see true job states), slurmctld, and one slurmd per node.
#
# Every node is a slurmd in its own network namespace, a host of the emulated network local runs use
# (reproflow.launch.network): its own address on a bridge, its link shaped to LOCAL_SLURM_NETWORK each
# way (tc's token bucket), so a 2-node job's traffic crosses a shaped link as on a cluster, and a
# TaskProlog tells every task that network (REPROFLOW_NETWORK, recorded in each row). The controller,
# accounting and the commands reach the nodes through the bridge (the machine's address on it).
# Where the network cannot be built (no root or iproute2) or LOCAL_SLURM_NETWORK is empty, the nodes
# listen on loopback addresses 127.0.2.N instead, and rows say "loopback, unshaped". Each node is also
# in its own UTS namespace (hostname node1, node2, ...), so jobs see distinct node names, and in its own
# mount namespace (host mounts still reach it), so a test can take a folder away from one node. Nodes advertise stand-in GPUs as GRES, so GPU scripts can be scheduled;
# the jobs themselves find no GPU and run on CPU with gloo.
#
# Containers: Slurm's OCI support with runc (oci.conf), and Pyxis with Enroot where
# tests/enroot-pyxis.sh installed them (PYXIS_PLUGIN, default /usr/local/lib/slurm/spank_pyxis.so): a
# plugstack.conf loads the plugin, and an enroot.conf.d file gives each node its own Enroot data and
# runtime folders under $DIR/enroot/<node> (Enroot reads $(hostname) there; Pyxis passes Enroot no
# environment but PATH, so the folders cannot come from each slurmd's environment).
#
# It starts from nothing: every file the cluster reads is written by this start before any daemon
# or Slurm command runs, and nothing an earlier cluster or another checkout left is trusted.
#   /etc/slurm/slurm.conf, slurmdbd.conf, gres.conf, oci.conf, plugstack.conf (with Pyxis)  written here;
#       anything else in /etc/slurm (the package's plugstack.conf, stale files) is moved to $DIR/aside and
#       put back by stop.sh
#   <Enroot's configuration folder>/enroot.conf.d/90-local-slurm.conf (with Pyxis)  written here, removed by stop.sh
#   $DIR/munge/munge.key   a new key; munged runs on its own socket ($DIR/munge), named in AuthInfo
#                          and, for connections to slurmdbd, AccountingStoragePass
#   $DIR/mysql             a new MariaDB data folder, its own socket and port, no option files read
#   /etc/hosts             the node lines, tagged "# local-slurm"
# $DIR/system-files lists each with its SHA-256 (sha256sum's format); every Slurm command below runs
# through `slurm`, which refuses to run it while /etc/slurm holds a file this start did not write.
#
# Idempotent: when the recorded daemons are alive, the files are the ones their start wrote and the
# nodes answer, it only says so. On failure it stops what it started (tests/slurm/stop.sh).
# Knobs: LOCAL_SLURM_DIR (state, logs, pids; default <repo>/.local-slurm), LOCAL_SLURM_NODES (2),
# LOCAL_SLURM_GPUS (8 per node), LOCAL_SLURM_CPUS (each node's, default this machine's cores; more lets a
# job start more ranks than there are cores, as local runs do), LOCAL_SLURM_NETWORK (each node's link
# rate, default 1gbit; '' for loopback), LOCAL_SLURM_JOBS (jobs running at once, default 0: no limit; the
# nodes share this machine's cores, so timings of jobs run side by side disturb each other, which a
# cluster's nodes do not: 1 runs them one at a time, an accounting limit on root's jobs), PYXIS_PLUGIN.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
: "${LOCAL_SLURM_DIR:=$repo/.local-slurm}"
: "${LOCAL_SLURM_NODES:=2}"
: "${LOCAL_SLURM_GPUS:=8}"
: "${LOCAL_SLURM_NETWORK=1gbit}"
: "${LOCAL_SLURM_CPUS:=$(nproc)}"
: "${LOCAL_SLURM_JOBS:=0}"
: "${PYXIS_PLUGIN:=/usr/local/lib/slurm/spank_pyxis.so}"
DIR=$LOCAL_SLURM_DIR
CLUSTER=reproflowtest
pyxis=""
if [ -f "$PYXIS_PLUGIN" ] && command -v enroot >/dev/null; then pyxis=$PYXIS_PLUGIN; fi
SIGNATURE="nodes=$LOCAL_SLURM_NODES cpus=$LOCAL_SLURM_CPUS gpus=$LOCAL_SLURM_GPUS dir=$DIR pyxis=${pyxis:-none} network=${LOCAL_SLURM_NETWORK:-loopback} jobs=$LOCAL_SLURM_JOBS"
MANIFEST=$DIR/system-files
MUNGE_SOCKET=$DIR/munge/munge.socket
DB_PORT=16819
PORTS=(6817 6819 "$DB_PORT")
for i in $(seq 1 "$LOCAL_SLURM_NODES"); do PORTS+=($((17000 + i))); done
# A shell's SLURM_CONF would point the commands below at another cluster's file.
export SLURM_CONF=/etc/slurm/slurm.conf

say() { printf 'local-slurm: %s\n' "$*"; }

alive() {  # a recorded pid that is running and not a zombie
    local pid=$1 state
    [ -r "/proc/$pid/stat" ] || return 1
    state=$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null) || return 1
    [ "$state" != Z ]
}

# Every file in /etc/slurm is one the manifest lists, unchanged, and slurm.conf is among them.
owned() {
    local f
    [ -s "$MANIFEST" ] && grep -q ' /etc/slurm/slurm\.conf$' "$MANIFEST" || return 1
    sha256sum --check --status "$MANIFEST" 2>/dev/null || return 1
    for f in /etc/slurm/* /etc/slurm/.[!.]*; do
        [ -e "$f" ] || [ -L "$f" ] || continue
        grep -q "  $f\$" "$MANIFEST" || return 1
    done
}

slurm() {  # run a Slurm command only on configuration this start wrote
    if ! owned; then
        say "refusing to run $1: /etc/slurm holds a file this start did not write (see $MANIFEST)"
        exit 1
    fi
    "$@" || { local rc=$?; say "$* failed (exit $rc)"; return $rc; }
}

all_alive() {
    [ -s "$DIR/daemons" ] && [ "$(cat "$DIR/signature" 2>/dev/null)" = "$SIGNATURE" ] || return 1
    while read -r _ pid; do alive "$pid" || return 1; done < "$DIR/daemons"
    owned || return 1
    timeout 5 scontrol ping >/dev/null 2>&1 || return 1
    [ "$(sinfo -h -o '%T' 2>/dev/null | grep -cE '^(idle|mixed|allocated)')" -ge 1 ]
}

if command -v scontrol >/dev/null && all_alive; then
    say "already running ($SIGNATURE)"
    exit 0
fi
if [ -s "$DIR/daemons" ] || [ -d "$DIR/aside" ]; then bash "$here/stop.sh" >/dev/null 2>&1 || true; fi

# Daemons this script did not start (another checkout's test cluster, a real Slurm or MariaDB) hold
# the ports: say so instead of failing half-way.
listening() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
for port in "${PORTS[@]}"; do
    if listening "$port"; then
        say "port $port on this machine is taken by a process not started from $DIR; the test cluster uses ports ${PORTS[*]}."
        say "stop it first (for another checkout's test cluster: LOCAL_SLURM_DIR=<its .local-slurm> tests/slurm/stop.sh)."
        exit 1
    fi
done
if [ $(( ${#MUNGE_SOCKET} )) -gt 100 ]; then
    say "LOCAL_SLURM_DIR is too long for a Unix socket path ($MUNGE_SOCKET); set a shorter LOCAL_SLURM_DIR."
    exit 1
fi

# 1. Packages (Debian's): slurmctld, slurmd, slurmdbd, munge, MariaDB; runc and squashfs-tools for
# Slurm's OCI container support (srun --container).
need=()
for pkg in slurm-wlm slurmdbd munge mariadb-server runc squashfs-tools; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || need+=("$pkg")
done
if [ ${#need[@]} -gt 0 ]; then
    say "installing ${need[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null
    apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

# From here on, a failure names the command, stops whatever was started and puts /etc back.
set -E
trap 'say "failed (exit $?) at line $LINENO: $BASH_COMMAND"' ERR
trap 'rc=$?; if [ $rc -ne 0 ]; then say "start failed; stopping what was started"; bash "$here/stop.sh" >/dev/null 2>&1; fi' EXIT
mkdir -p "$DIR"/{log,pids,spool,ctld}
# A pid file left by daemons that did not stop (the machine went down) would be read as the new one's.
rm -rf "${DIR:?}"/pids/* "${DIR:?}"/ctld/* "${DIR:?}"/spool/* "${DIR:?}"/log/* "${DIR:?}"/mysql "${DIR:?}"/munge "${DIR:?}"/runc
: > "$DIR/daemons"
: > "$MANIFEST"
record() { echo "$1 $2" >> "$DIR/daemons"; }
written() { sha256sum "$@" >> "$MANIFEST"; }

wait_for() {  # wait_for SECONDS DESCRIPTION COMMAND...
    local limit=$1 what=$2; shift 2
    local end=$((SECONDS + limit))
    until "$@" >/dev/null 2>&1; do
        if [ $SECONDS -ge $end ]; then say "timed out waiting for $what; logs in $DIR/log"; exit 1; fi
        sleep 0.2
    done
}

pidfile_pid() { wait_for 20 "$1" test -s "$1"; cat "$1"; }

# 2. The nodes' network: hosts of a shaped bridge (reproflow.launch.network, stdlib only), or loopback.
network() { PYTHONPATH="$repo/src" python3 -m reproflow.launch.network "$@"; }
gateway=127.0.0.1 addresses=() namespaces=() description="loopback, unshaped"
if [ -n "$LOCAL_SLURM_NETWORK" ]; then
    if built=$(network up slurm --hosts "$LOCAL_SLURM_NODES" --rate "$LOCAL_SLURM_NETWORK" 2>"$DIR/log/network.log"); then
        eval "$built"
        read -r -a addresses <<< "$addresses"
        read -r -a namespaces <<< "$namespaces"
        say "nodes on an emulated network: $description"
    else
        say "no emulated network ($(cat "$DIR/log/network.log")); the nodes listen on loopback, unshaped"
    fi
fi
if [ ${#addresses[@]} -eq 0 ]; then
    for i in $(seq 1 "$LOCAL_SLURM_NODES"); do addresses+=("127.0.2.$i"); done
fi
echo "$description" > "$DIR/network"

# 3. Configuration: /etc/slurm holds exactly the files written here.
mkdir -p /etc/slurm
aside=()
for f in /etc/slurm/* /etc/slurm/.[!.]*; do
    [ -e "$f" ] || [ -L "$f" ] || continue
    case ${f##*/} in slurm.conf | slurmdbd.conf | gres.conf | oci.conf) rm -f "$f"; continue ;; esac
    mkdir -p "$DIR/aside"
    mv "$f" "$DIR/aside/"
    aside+=("${f##*/}")
done
[ ${#aside[@]} -eq 0 ] || say "moved aside until stop.sh: ${aside[*]} (from /etc/slurm to $DIR/aside)"

# Job ids continue across restarts so stale submitit folders never match.
first_job=$(cat "$DIR/next_job_id" 2>/dev/null || echo 1)
cpus=$LOCAL_SLURM_CPUS
mem=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 / LOCAL_SLURM_NODES / 2 ))
{
    cat <<EOF
ClusterName=$CLUSTER
SlurmctldHost=$(hostname -s)($gateway)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$MUNGE_SOCKET
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
AccountingStorageHost=$gateway
AccountingStoragePort=6819
AccountingStoragePass=$MUNGE_SOCKET
JobAcctGatherType=jobacct_gather/linux
JobAcctGatherFrequency=30
TaskProlog=$DIR/task-prolog
$( [ "$LOCAL_SLURM_JOBS" -gt 0 ] && echo "AccountingStorageEnforce=associations,limits" || true )
# The nodes' CPUs as configured (LOCAL_SLURM_CPUS), not as slurmd counts them on this machine.
SlurmdParameters=config_overrides
EOF
    for i in $(seq 1 "$LOCAL_SLURM_NODES"); do
        echo "NodeName=node$i NodeHostname=node$i NodeAddr=${addresses[i-1]} Port=$((17000 + i)) CPUs=$cpus RealMemory=$mem Gres=gpu:$LOCAL_SLURM_GPUS State=UNKNOWN"
    done
    echo "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP"
} > /etc/slurm/slurm.conf

cat > /etc/slurm/slurmdbd.conf <<EOF
AuthType=auth/munge
AuthInfo=socket=$MUNGE_SOCKET
DbdHost=localhost
DbdAddr=127.0.0.1
DbdPort=6819
SlurmUser=root
DebugLevel=info
LogFile=$DIR/log/slurmdbd.log
PidFile=$DIR/pids/slurmdbd.pid
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$DB_PORT
StorageUser=slurm
StoragePass=slurm
StorageLoc=${CLUSTER}_acct
EOF
chmod 600 /etc/slurm/slurmdbd.conf

# Stand-in GPUs: character devices with /dev/null's numbers, so the GPU scripts can be scheduled
# (Slurm needs a device file per GPU). Jobs find no real GPU and run on CPU.
mkdir -p "$DIR/fake-gpu"
for g in $(seq 0 $((LOCAL_SLURM_GPUS - 1))); do
    [ -c "$DIR/fake-gpu/gpu$g" ] || mknod "$DIR/fake-gpu/gpu$g" c 1 3
done
echo "Name=gpu File=$DIR/fake-gpu/gpu[0-$((LOCAL_SLURM_GPUS - 1))]" > /etc/slurm/gres.conf
# Slurm's OCI support: `srun --container=<bundle>` runs each task with runc (state in $DIR/runc); the
# container id is unique per node, user, job, step and task.
id='%n.%u.%j.%s.%t'
cat > /etc/slurm/oci.conf <<EOF
RunTimeQuery="runc --root=$DIR/runc state $id"
RunTimeKill="runc --root=$DIR/runc kill -a $id"
RunTimeDelete="runc --root=$DIR/runc delete --force $id"
RunTimeRun="runc --root=$DIR/runc run $id --bundle %b"
EOF
# Every task learns the network it runs on, as a site's TaskProlog sets a job's environment. And its
# node's share of this machine's cores as torch's thread count: the nodes share the cores, and a rank
# that takes them all runs its threads against the other node's (a cluster's nodes have their own).
threads=$(( $(nproc) / LOCAL_SLURM_NODES ))
cat > "$DIR/task-prolog" <<END
#!/bin/sh
# Written by the test cluster's start (tests/slurm/start.sh): the network every task runs on, and
# each node's share of the machine's cores (unless the job sets OMP_NUM_THREADS).
echo "export REPROFLOW_NETWORK=$description"
[ -n "\$OMP_NUM_THREADS" ] || echo "export OMP_NUM_THREADS=$(( threads > 0 ? threads : 1 ))"
END
chmod 755 "$DIR/task-prolog"
written /etc/slurm/slurm.conf /etc/slurm/slurmdbd.conf /etc/slurm/gres.conf /etc/slurm/oci.conf "$DIR/task-prolog"

# Pyxis: loaded by srun, sbatch and every slurmd; named containers live as long as their job. Enroot's
# folders per node, so the two nodes on this machine do not share containers.
if [ -n "$pyxis" ]; then
    echo "required $pyxis runtime_path=$DIR/pyxis container_scope=job sbatch_support=1" > /etc/slurm/plugstack.conf
    written /etc/slurm/plugstack.conf
    enroot_conf=$(sed -n 's/^config::export ENROOT_SYSCONF_PATH *"\(.*\)"$/\1/p' "$(command -v enroot)")/enroot.conf.d
    mkdir -p "$enroot_conf" "$DIR/enroot"
    cat > "$enroot_conf/90-local-slurm.conf" <<EOF
# Written by the test cluster's start (tests/slurm/start.sh); its stop removes it.
ENROOT_RUNTIME_PATH $DIR/enroot/\$(hostname)/run/\${UID}
ENROOT_DATA_PATH $DIR/enroot/\$(hostname)/data/\${UID}
ENROOT_CACHE_PATH $DIR/enroot/\$(hostname)/cache/\${UID}
EOF
    # Slurm runs the TaskProlog inside a Pyxis task's container, so the container needs the file.
    mkdir -p "${enroot_conf%/*}/mounts.d"
    echo "$DIR/task-prolog $DIR/task-prolog none x-create=file,bind,ro,nosuid,nodev" \
        > "${enroot_conf%/*}/mounts.d/90-local-slurm.fstab"
    written "$enroot_conf/90-local-slurm.conf" "${enroot_conf%/*}/mounts.d/90-local-slurm.fstab"
    say "Pyxis ($pyxis) and enroot $(enroot version) on the nodes"
else
    say "no Pyxis here ($PYXIS_PLUGIN or enroot missing: tests/enroot-pyxis.sh installs them); containers run through Slurm's OCI support only"
fi

# Node names resolve to their addresses (a minimal system may have no /etc/hosts yet).
touch /etc/hosts
sed -i '/# local-slurm$/d' /etc/hosts
for i in $(seq 1 "$LOCAL_SLURM_NODES"); do echo "${addresses[i-1]} node$i # local-slurm" >> /etc/hosts; done
written /etc/hosts
echo "$SIGNATURE" > "$DIR/signature"

# 4. munge: a new key and a daemon of the cluster's own, on the socket AuthInfo names. Jobs run as
# root, so --force lets the socket sit under a home folder others cannot enter.
mkdir -p "$DIR/munge"
chmod 755 "$DIR/munge"
dd if=/dev/urandom of="$DIR/munge/munge.key" bs=1024 count=1 status=none
chmod 400 "$DIR/munge/munge.key"
written "$DIR/munge/munge.key"
/usr/sbin/munged --force --key-file="$DIR/munge/munge.key" --socket="$MUNGE_SOCKET" \
    --pid-file="$DIR/pids/munged.pid" --log-file="$DIR/log/munged.log" --seed-file="$DIR/munge/munged.seed"
record munged "$(pidfile_pid "$DIR/pids/munged.pid")"
munge_ok() { munge -n -S "$MUNGE_SOCKET" | unmunge -S "$MUNGE_SOCKET"; }
wait_for 20 munged munge_ok

# 5. Accounting: a new MariaDB (no option files read, data in $DIR/mysql, 127.0.0.1:$DB_PORT), then slurmdbd.
db_options=(--no-defaults --user=root --datadir="$DIR/mysql" --socket="$DIR/mysql/mysqld.sock"
            --innodb-buffer-pool-size=64M --innodb-log-file-size=16M)
mariadb-install-db "${db_options[@]}" --auth-root-authentication-method=socket --skip-test-db \
    >"$DIR/log/mariadb-install.log" 2>&1
nohup mariadbd "${db_options[@]}" --bind-address=127.0.0.1 --port="$DB_PORT" --skip-name-resolve \
    --pid-file="$DIR/pids/mariadbd.pid" >"$DIR/log/mariadb.log" 2>&1 &
record mariadbd $!
db() { mariadb --no-defaults --socket="$DIR/mysql/mysqld.sock" "$@"; }
wait_for 60 MariaDB mariadb-admin --no-defaults --socket="$DIR/mysql/mysqld.sock" ping
db -e "CREATE DATABASE ${CLUSTER}_acct;
       CREATE USER 'slurm'@'127.0.0.1' IDENTIFIED BY 'slurm';
       GRANT ALL ON ${CLUSTER}_acct.* TO 'slurm'@'127.0.0.1';"

slurm slurmdbd
record slurmdbd "$(pidfile_pid "$DIR/pids/slurmdbd.pid")"
# slurmctld gives up at once when slurmdbd does not answer yet.
wait_for 60 slurmdbd slurm sacctmgr -n show cluster

# 6. Controller.
slurm slurmctld
record slurmctld "$(pidfile_pid "$DIR/pids/slurmctld.pid")"
wait_for 30 slurmctld slurm scontrol ping

# 7. Nodes: each slurmd in its host's network namespace (where there is one) and its own UTS
# namespace, so `hostname` inside a job is the node name.
for i in $(seq 1 "$LOCAL_SLURM_NODES"); do
    inside=()
    # nsenter, not `ip netns exec`: that mounts a new /sys, without the cgroup file system slurmd reads.
    [ ${#namespaces[@]} -eq 0 ] || inside=(nsenter --net="/run/netns/${namespaces[i-1]}")
    slurm "${inside[@]}" unshare --uts --mount --propagation slave sh -c "hostname node$i && exec slurmd -N node$i"
    record "slurmd-node$i" "$(pidfile_pid "$DIR/pids/slurmd-node$i.pid")"
done
idle() { [ "$(slurm sinfo -h -N -o '%T' | grep -c '^idle')" -eq "$LOCAL_SLURM_NODES" ]; }
wait_for 30 "idle nodes" idle
clustered() { slurm sacctmgr -n -P show cluster format=cluster | grep -qx "$CLUSTER"; }
wait_for 30 "accounting registration" clustered
if [ "$LOCAL_SLURM_JOBS" -gt 0 ]; then
    slurm sacctmgr -i modify user root set GrpJobs="$LOCAL_SLURM_JOBS" >/dev/null
    limited() { [ "$(slurm scontrol show assoc_mgr users=root flags=assoc 2>/dev/null | grep -c "GrpJobs=$LOCAL_SLURM_JOBS(")" -ge 1 ]; }
    wait_for 30 "root's limit of $LOCAL_SLURM_JOBS job(s) at once" limited
fi
slurm true
say "up: $LOCAL_SLURM_NODES nodes ($description), accounting on; state in $DIR"
say "files the cluster reads, each written by this start (SHA-256 in $MANIFEST):"
while read -r _ f; do say "  $f"; done < "$MANIFEST"
say "  $DIR/mysql (MariaDB's data, made by mariadb-install-db --no-defaults)"
sinfo
