#!/usr/bin/env bash
# Stop the test cluster started by tests/slurm/start.sh: cancel jobs, then stop exactly the
# daemons it recorded (TERM, then KILL after 15 s) and stray slurmstepd; remove the files it wrote
# (the /etc/slurm files and Enroot's drop-ins still as they were written, the /etc/hosts lines, the nodes' network, MariaDB's data,
# the munge key, the nodes' Enroot containers) and put back what it moved aside from /etc/slurm. $DIR/system-files stays as the record.
set -uo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
: "${LOCAL_SLURM_DIR:=$repo/.local-slurm}"
DIR=$LOCAL_SLURM_DIR
export SLURM_CONF=/etc/slurm/slurm.conf

say() { printf 'local-slurm: %s\n' "$*"; }
alive() {
    local state
    [ -r "/proc/$1/stat" ] || return 1
    state=$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null) || return 1
    [ "$state" != Z ]
}

restore() {  # the files start.sh wrote go, the ones it moved aside come back
    local sum f
    if [ -s "$DIR/system-files" ]; then
        while read -r sum f; do
            case $f in
                /etc/slurm/* | */enroot.conf.d/90-local-slurm.conf | */mounts.d/90-local-slurm.fstab)
                    echo "$sum  $f" | sha256sum --check --status 2>/dev/null && rm -f "$f" ;;
            esac
        done < "$DIR/system-files"
    fi
    if [ -d "$DIR/aside" ]; then
        for f in "$DIR"/aside/* "$DIR"/aside/.[!.]*; do
            [ -e "$f" ] || [ -L "$f" ] || continue
            if [ -e "/etc/slurm/${f##*/}" ]; then
                say "not putting back ${f##*/}: /etc/slurm has a new one (the old one stays in $DIR/aside)"
            else
                mv "$f" /etc/slurm/
            fi
        done
        rmdir "$DIR/aside" 2>/dev/null || true
    fi
    sed -i '/# local-slurm$/d' /etc/hosts
    PYTHONPATH="$repo/src" python3 -m reproflow.launch.network down slurm 2>/dev/null || true
    rm -rf "${DIR:?}/mysql" "${DIR:?}/munge" "${DIR:?}/enroot" "${DIR:?}/pyxis"
}

if [ ! -s "$DIR/daemons" ]; then
    restore
    say "not running (no $DIR/daemons)"
    exit 0
fi

# Keep job ids increasing across restarts.
next=$(timeout 5 scontrol show config 2>/dev/null | awk '/^NEXT_JOB_ID/ {print $3}')
[ -n "$next" ] && echo "$next" > "$DIR/next_job_id"
timeout 10 scancel --quiet --user=root 2>/dev/null || true

# Nodes first, the controller, accounting, then munge (reverse start order).
mapfile -t entries < <(tac "$DIR/daemons")
for entry in "${entries[@]}"; do
    read -r name pid <<< "$entry"
    if alive "$pid"; then kill -TERM "$pid" 2>/dev/null || true; fi
    for _ in $(seq 1 75); do alive "$pid" || break; sleep 0.2; done
    if alive "$pid"; then say "$name ($pid) ignored TERM; killing"; kill -KILL "$pid" 2>/dev/null || true; fi
done
for exe in /proc/[0-9]*/exe; do
    if [ "$(readlink "$exe" 2>/dev/null)" = /usr/sbin/slurmstepd ]; then
        pid=${exe#/proc/}; pid=${pid%/exe}
        kill -KILL "$pid" 2>/dev/null || true
    fi
done
rm -f "$DIR/daemons"
restore
say "stopped"
