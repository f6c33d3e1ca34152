#!/usr/bin/env bash
# The README's two commands on a fresh Debian machine. For each command asked for, a new Debian root
# filesystem (mmdebstrap, from Debian's packages) with only the packages the README tells users to
# install first, a clean clone of the current commit in it, and the command run there as root, in
# its own PID, mount, UTS and IPC namespaces (every process it leaves is killed when it ends), the root
# made the namespace's / by pivot_root (not chroot: the kernel refuses a user namespace, which Enroot
# makes, to a chrooted process). Nothing comes from this machine but its network and package
# configuration: the local CA certificates, proxy variables, apt's Debian mirror, pip's configuration
# with the local files and folders it names (wheel and index folders, a constraints file), and the
# source mirror of third-party sources, THIRD_PARTY (default ../shared/third-party beside the checkout),
# at the same place beside the clone (all bound read-only).
#
# Usage: tests/clean-room.sh [test] [demo] [demo-full] [cluster] [gpu-image]    (default: test demo)
#   test       make test
#   demo       make demo ONLY=<a short set of targets>: four families, a few minutes
#   demo-full  make demo (about 25 minutes on 2 cores)
#   cluster    make demo, then make cluster-reproduce (the same plan on the test cluster through Pyxis)
#   gpu-image  make gpu-image-here (the gpu flavour on a stand-in CUDA base; see docs/containers.md)
# Prints each command's result and wall time; the logs, summary.md and the test cluster's logs go to
# CLEAN_ROOM_OUT (default <repo>/.clean-room). A failed command's root filesystem is kept there for a
# look; CLEAN_ROOM_KEEP=1 keeps every one. CLEAN_ROOM_MIRROR sets
# the Debian mirror (default http://deb.debian.org/debian). Needs root, unshare and Debian's apt
# (mmdebstrap is installed when missing). Only committed files are in the clone.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
OUT=${CLEAN_ROOM_OUT:-$repo/.clean-room}
MIRROR=${CLEAN_ROOM_MIRROR:-http://deb.debian.org/debian}
SHORT_DEMO=comms,resharding-1-to-m,spatial-check,fig8
commands=("$@")
[ ${#commands[@]} -gt 0 ] || commands=(test demo)

say() { printf 'clean-room: %s\n' "$*"; }
die() { say "$*" >&2; exit 2; }

for c in "${commands[@]}"; do
    case $c in test | demo | demo-full | cluster | gpu-image) ;; *) die "unknown command '$c'; choose from: test demo demo-full cluster gpu-image" ;; esac
done
[ "$(id -u)" = 0 ] || die "needs root (a root filesystem, namespaces and mounts); run it as root"
command -v unshare >/dev/null || die "needs unshare (util-linux)"
# The test cluster inside uses these ports on the shared network; one running here would answer instead.
for port in 6817 6819 16819; do
    if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
        die "port $port is in use here (a test cluster? tests/slurm/stop.sh stops it); the clean room needs it"
    fi
done
if ! command -v mmdebstrap >/dev/null; then
    command -v apt-get >/dev/null || die "needs mmdebstrap, and apt-get to install it"
    say "installing mmdebstrap"
    apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq mmdebstrap >/dev/null
fi

# What the README tells users to install before the two commands: its `apt-get install -y` line.
read -r -a prereqs < <(sed -n 's/^\(sudo \)\{0,1\}apt-get install -y \([^#]*\).*/\2/p' "$repo/README.md")
[ ${#prereqs[@]} -gt 0 ] || die "README.md has no 'apt-get install -y ...' line of prerequisites"
suite=$(. /etc/os-release && echo "${VERSION_CODENAME:-}")
[ -n "$suite" ] || die "cannot tell this machine's Debian release from /etc/os-release"
commit=$(git -C "$repo" rev-parse HEAD)
if [ -n "$(git -C "$repo" status --porcelain --untracked-files=no)" ]; then
    say "uncommitted changes are not in the clean room; it runs commit ${commit:0:12}"
fi

# pip's configuration: its files, PIP_* variables, and the local files and folders they name.
pip_files=() binds=()
for f in /etc/pip.conf /etc/xdg/pip/pip.conf "$HOME/.config/pip/pip.conf" "$HOME/.pip/pip.conf" \
         ${PIP_CONFIG_FILE:-}; do
    [ -f "$f" ] && pip_files+=("$f")
done
while read -r path; do
    path=${path#file://}
    [ "${path##*/}" = simple ] && path=${path%/simple}  # an index's files sit beside its simple/ folder
    [ -e "$path" ] && binds+=("$path:$path")
done < <({ cat "${pip_files[@]}" /dev/null; env | grep '^PIP_'; } | grep -oE '(file://)?/[^ ,"]+' | sort -u)
# The source mirror tests/enroot-pyxis.sh looks in, where the clone's ../shared/third-party is.
mirror=${THIRD_PARTY:-$repo/../shared/third-party}
[ ! -d "$mirror" ] || binds+=("$(cd "$mirror" && pwd):/root/shared/third-party")
envs=()
while IFS= read -r line; do envs+=("$line"); done < <(env | grep -E '^(PIP_[A-Z_]+|[a-zA-Z_]*_proxy|[A-Z_]*_PROXY|SSL_CERT_FILE|SSL_CERT_DIR|REQUESTS_CA_BUNDLE|CURL_CA_BUNDLE)=' || true)

# make_root DIR: a fresh Debian of this machine's release with the README's prerequisites.
make_root() {
    local root=$1
    rm -rf "$root"
    mmdebstrap --quiet --variant=minbase --include="$(IFS=,; echo "${prereqs[*]}")" \
        --customize-hook='mkdir -p "$1/usr/local/share/ca-certificates"' \
        --customize-hook="copy-in /etc/resolv.conf /etc" \
        "$suite" "$root" \
        "deb $MIRROR $suite main" "deb $MIRROR $suite-updates main" \
        "deb ${MIRROR%/debian}/debian-security $suite-security main"
    # Network configuration: the local CA certificates (a TLS-inspecting egress needs them), then
    # the bundle rebuilt with them as Debian's ca-certificates does.
    if compgen -G '/usr/local/share/ca-certificates/*' >/dev/null; then
        cp -a /usr/local/share/ca-certificates/. "$root/usr/local/share/ca-certificates/"
        chroot "$root" update-ca-certificates >/dev/null 2>&1 || say "update-ca-certificates failed in the root"
    fi
    echo clean-room > "$root/etc/hostname"
    printf '127.0.0.1 localhost\n127.0.1.1 clean-room\n' > "$root/etc/hosts"
    local f
    for f in "${pip_files[@]}"; do
        mkdir -p "$root$(dirname "${f/#$HOME//root}")"
        cp "$f" "$root${f/#$HOME//root}"
    done
    git clone --quiet --no-local "$repo" "$root/root/reproflow"
    git -C "$root/root/reproflow" checkout --quiet --detach "$commit"
}

# run_in_root DIR LOG COMMAND: COMMAND in the clone, as root, in new namespaces; its exit status.
run_in_root() {
    local root=$1 log=$2 command=$3
    unshare --pid --fork --kill-child --mount --uts --ipc -- bash -c '
        set -e
        root=$1 command=$2; shift 2
        binds=() envs=()
        while [ "$1" != -- ]; do binds+=("$1"); shift; done; shift
        envs=("$@")
        hostname clean-room
        # The root a mount point of its own, as / is on a booted machine (buildah remounts / private).
        mount --bind "$root" "$root"
        mount -t proc proc "$root/proc"
        mount --rbind /sys "$root/sys"  # with its cgroup mounts, as a booted machine has (slurmd needs them)
        mount --rbind /dev "$root/dev"
        mount -t tmpfs -o mode=1777 tmpfs "$root/dev/shm"
        mount -t tmpfs -o mode=1777 tmpfs "$root/tmp"
        mount -t tmpfs -o mode=755 tmpfs "$root/run"
        for pair in "${binds[@]}"; do
            path=${pair%%:*} at=$root${pair#*:}
            if [ -d "$path" ]; then mkdir -p "$at"; else mkdir -p "${at%/*}" && touch "$at"; fi
            mount --bind "$path" "$at"
            mount -o remount,bind,ro "$at"
        done
        # The root becomes / of this mount namespace and the old one is let go.
        cd "$root"
        mkdir -p .old-root
        pivot_root . .old-root
        umount -l /.old-root
        rmdir /.old-root
        # The signals of a fresh machine: none ignored, however this script was started (nohup, &).
        exec /usr/bin/env -i --default-signal HOME=/root LANG=C.UTF-8 TERM=dumb CI=true \
            PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin "${envs[@]}" \
            bash -c "cd /root/reproflow && $command"
    ' clean-room "$root" "$command" "${binds[@]}" -- "${envs[@]}" >"$log" 2>&1
}

clock() { printf '%dm%02ds' $(($1 / 60)) $(($1 % 60)); }

mkdir -p "$OUT"
summary=$OUT/summary.md
{
    echo "# Clean-room run of commit $commit"
    echo
    echo "Debian $suite (mmdebstrap minbase) + README prerequisites: ${prereqs[*]}; $(nproc) cores, $(date -u +%FT%TZ)"
    echo
    echo "| command | result | set-up | wall time | log |"
    echo "|---|---|---|---|---|"
} > "$summary"
failed=0 cluster_files=
for c in "${commands[@]}"; do
    case $c in
        test) command="make test" ;;
        demo) command="make demo ONLY=$SHORT_DEMO" ;;
        demo-full) command="make demo" ;;
        cluster) command="make demo && make cluster-reproduce" ;;
        gpu-image) command="make gpu-image-here" ;;
    esac
    root=$OUT/root-$c log=$OUT/$c.log
    say "$c: a fresh Debian $suite root in $root"
    t0=$SECONDS
    make_root "$root"
    setup=$((SECONDS - t0))
    say "$c: running '$command' (log: $log)"
    t0=$SECONDS
    rc=0
    run_in_root "$root" "$log" "$command" || rc=$?
    wall=$((SECONDS - t0))
    result=ok; [ $rc -eq 0 ] || { result="failed (exit $rc)"; failed=1; }
    say "$c: $command: $result in $(clock $wall) (root set up in $(clock $setup))"
    echo "| \`$command\` | $result | $(clock $setup) | $(clock $wall) | $log |" >> "$summary"
    files=$root/root/reproflow/.local-slurm/system-files
    if [ "$c" = test ] && [ -s "$files" ]; then
        cluster_files=$(printf '\nFiles the test cluster read, each written by its start (SHA-256):\n\n'
                        sed 's/^/    /' "$files")
        echo "$cluster_files"
    fi
    tail -n 5 "$log" | sed "s/^/clean-room: $c | /"
    # What explains a result outlives the root: the test cluster's logs, the tests' artifacts, the demo's
    # step logs, reports (tables, figures, claims) and run manifests (its start, end and state).
    for kept in .local-slurm/log test-artifacts logs/reproduce reports results/runs \
                .local-images/reproflow-gpu.summary.md cluster-run/logs/reproduce cluster-run/reports \
                cluster-run/compare; do
        [ -e "$root/root/reproflow/$kept" ] || continue
        mkdir -p "$OUT/$c-files/$(dirname "$kept")"
        cp -a "$root/root/reproflow/$kept" "$OUT/$c-files/$(dirname "$kept")/"
    done
    if [ $rc -ne 0 ] || [ -n "${CLEAN_ROOM_KEEP:-}" ]; then
        say "$c: root kept for a look: $root (chroot $root bash)"
    elif grep -q " $root/" /proc/mounts; then
        say "not removing $root: something is still mounted there"
    else
        rm -rf "$root"
    fi
done
[ -z "$cluster_files" ] || echo "$cluster_files" >> "$summary"
say "summary: $summary"
exit $failed
