#!/usr/bin/env bash
# make containers: build reproflow's images (containers/reproflow.Dockerfile) with what this machine has and
# squash each into the file Pyxis/Enroot runs.
#   bash containers/build.sh [gpu] [cpu]          APPS=/apps (a filesystem every node mounts; default gpu)
# Writes, per flavour, $APPS/reproflow-<flavour>.sqsh, .sqsh.sha256 (sha256sum's format, recorded in every
# result row of jobs that use it) and .sqsh.json (the image's id, builder, base, commit, squash tool).
#
# Builder: docker when its engine answers, else podman, else buildah (BUILDER= to choose). Squash:
# `enroot import -o <file> dockerd://<image>` (podman:// with podman, in place of the recipe's dockerd://)
# where enroot exists and the builder is docker or podman; otherwise mksquashfs of the image's root
# filesystem with Enroot's options (what enroot import produces), the image's environment written to
# /etc/environment as Enroot does. An unchanged image is not squashed again.
# The cpu flavour: BASE_IMAGE (e.g. debian:bookworm-slim), or by default a Debian 12 root filesystem made
# with mmdebstrap (no registry needed; kept as localhost/reproflow-base:bookworm). With podman or buildah its
# Python wheels are prepared with this machine's pip configuration (in WHEELS, default
# ~/.cache/reproflow/wheels/<hash of the lock>) and installed with no index; docker builds download them.
# PYTHON (default python3) prepares them and must be the image's Python, 3.11.
set -euo pipefail
shopt -s inherit_errexit
cd "$(dirname "$0")/.."
: "${APPS:=/apps}"
: "${PYTHON:=python3}"
DOCKERFILE=${DOCKERFILE:-containers/reproflow.Dockerfile}
BASE_TAG=localhost/reproflow-base:bookworm
# Enroot's default ENROOT_SQUASH_OPTIONS: fast to make and to mount.
SQUASH_OPTIONS=(-comp lzo -noI -noD -noF -noX -no-duplicates)
flavours=("$@")
[ ${#flavours[@]} -gt 0 ] || flavours=(gpu)

say() { printf 'make containers: %s\n' "$*"; }
die() { say "$*" >&2; exit 1; }

for flavour in "${flavours[@]}"; do
    case $flavour in gpu | cpu) ;; *) die "no flavour '$flavour': choose gpu or cpu" ;; esac
done

# The builder, and one message naming what would work when there is none.
builder=${BUILDER:-}
if [ -z "$builder" ]; then
    if command -v docker >/dev/null && docker info >/dev/null 2>&1; then builder=docker
    elif command -v podman >/dev/null; then builder=podman
    elif command -v buildah >/dev/null; then builder=buildah
    else
        why=""
        command -v docker >/dev/null && why=" (docker is installed but its engine does not answer 'docker info')"
        die "no image builder here$why: install one of docker (docs.docker.com/engine/install), podman or buildah (Debian: apt-get install buildah)"
    fi
fi
command -v "$builder" >/dev/null || die "BUILDER=$builder is not installed; docker, podman or buildah can build"
# mksquashfs by hand stays for what enroot cannot import from: buildah's images, or no enroot at all.
squasher=mksquashfs
if command -v enroot >/dev/null && [ "$builder" != buildah ]; then squasher="enroot $(enroot version)"
elif ! command -v mksquashfs >/dev/null; then
    die "nothing here makes a squash file: install enroot (github.com/NVIDIA/enroot/releases) or squashfs-tools (mksquashfs)"
fi

build() {  # build FLAVOUR BASE WHEELS REF: the image; on failure, the step that failed
    local flavour=$1 base=$2 wheels=$3 ref=$4 log="$APPS/.build-reproflow-$1.log"
    local args=(--target image -f "$DOCKERFILE" -t "$ref" --build-arg "STACK=$flavour-stack"
                --build-arg "REPROFLOW_GIT_COMMIT=$(commit)")
    [ -z "$base" ] || args+=(--build-arg "BASE_IMAGE=$base")
    if [ "$flavour" = cpu ]; then args+=(--build-arg "TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu"); fi
    if [ -n "$wheels" ]; then args+=(--build-arg PIP_NO_INDEX=1 --volume "$wheels:/opt/wheels:ro"); fi
    case $builder in
        docker) args=(build "${args[@]}") ;;
        podman) args=(build --layers --isolation chroot "${args[@]}") ;;
        buildah) args=(bud --layers --isolation chroot "${args[@]}") ;;
    esac
    say "building $ref with $builder (log: $log)"
    if ! "$builder" "${args[@]}" . >"$log" 2>&1; then
        local step
        step=$(grep -E '^(\[[0-9]+/[0-9]+\] )?STEP [0-9]+/[0-9]+|^#[0-9]+ \[' "$log" | tail -n 1 || true)
        tail -n 15 "$log" >&2
        die "building reproflow-$flavour failed at ${step:-an unknown step}; the whole log: $log"
    fi
}

commit() {  # the checkout's commit, -dirty when tracked files changed (as result rows record it)
    local sha
    sha=$(git rev-parse HEAD 2>/dev/null) || { echo unknown; return; }
    [ -z "$(git status --porcelain --untracked-files=no 2>/dev/null)" ] || sha+=-dirty
    echo "$sha"
}

wheels() {  # the cpu image's wheels, prepared once per lock with this machine's pip configuration
    local key dir
    key=$(cat constraints.txt pyproject.toml | sha256sum | cut -c1-16)
    dir=${WHEELS:-${XDG_CACHE_HOME:-$HOME/.cache}/reproflow/wheels/$key}
    if [ ! -f "$dir/.complete" ]; then
        "$PYTHON" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' \
            || die "PYTHON=$PYTHON is not Python 3.11, the image's: its wheels would not install there"
        say "preparing the cpu image's wheels in $dir" >&2
        mkdir -p "$dir"
        "$PYTHON" containers/requirements.py pyproject.toml megatron deepspeed mpi > "$dir/requirements.txt"
        "$PYTHON" -m pip wheel -w "$dir" -c constraints.txt -r "$dir/requirements.txt" >"$dir/pip.log" 2>&1 \
            || { tail -n 15 "$dir/pip.log" >&2
                 die "pip could not prepare the wheels; check this machine's pip configuration ($dir/pip.log)"; }
        touch "$dir/.complete"
    fi
    echo "$dir"
}

cpu_base() {  # the cpu flavour's base image: BASE_IMAGE, or Debian 12 from mmdebstrap, kept as BASE_TAG
    if [ -n "${BASE_IMAGE:-}" ]; then echo "$BASE_IMAGE"; return; fi
    case $builder in
        docker) docker image inspect "$BASE_TAG" >/dev/null 2>&1 && { echo "$BASE_TAG"; return; } ;;
        *) "$builder" inspect --type image "$BASE_TAG" >/dev/null 2>&1 && { echo "$BASE_TAG"; return; } ;;
    esac
    command -v mmdebstrap >/dev/null \
        || die "the cpu image needs a Debian 12 base: install mmdebstrap (Debian: apt-get install mmdebstrap) or set BASE_IMAGE=debian:bookworm-slim"
    local tar
    tar=$(mktemp --suffix=.tar)
    say "making $BASE_TAG with mmdebstrap" >&2
    mmdebstrap --quiet --variant=minbase bookworm "$tar" >&2
    case $builder in
        docker | podman) "$builder" import "$tar" "$BASE_TAG" >/dev/null ;;
        buildah)
            local ctr
            ctr=$(buildah from scratch)
            buildah add --quiet "$ctr" "$tar" / >/dev/null
            buildah commit --quiet "$ctr" "$BASE_TAG" >/dev/null
            buildah rm "$ctr" >/dev/null ;;
    esac
    rm -f "$tar"
    echo "$BASE_TAG"
}

image_id() {
    case $builder in
        docker | podman) "$builder" image inspect --format '{{.Id}}' "$1" ;;
        buildah) buildah inspect --type image --format '{{.FromImageID}}' "$1" ;;
    esac
}

image_env() {  # the image's ENV, one NAME=value a line
    case $builder in
        docker | podman) "$builder" image inspect --format '{{range .Config.Env}}{{println .}}{{end}}' "$1" ;;
        buildah) buildah inspect --type image --format '{{range .OCIv1.Config.Env}}{{println .}}{{end}}' "$1" ;;
    esac
}

squash() {  # squash REF OUT: the image's root filesystem as Enroot's squash file
    local ref=$1 out=$2 tmp="$2.tmp" root ctr=""
    rm -f "$tmp"
    if [[ $squasher == enroot* ]]; then
        local scheme=dockerd shim=""
        if [ "$builder" = podman ]; then
            # enroot import podman:// removes its extraction container with `docker rm`, and fails (the
            # container left behind) where no docker engine answers, as here; podman answers to that
            # name, as podman-docker's does.
            scheme=podman shim=$(mktemp -d)
            ln -s "$(command -v podman)" "$shim/docker"
        fi
        PATH=${shim:+$shim:}$PATH enroot import -o "$tmp" "$scheme://$ref" >&2 \
            || die "enroot import $scheme://$ref failed; its output is above"
        [ -z "$shim" ] || rm -rf "$shim"
    else
        case $builder in
            docker)
                root=$(mktemp -d)
                ctr=$(docker create "$ref")
                docker export "$ctr" | tar -x -C "$root"
                docker rm "$ctr" >/dev/null; ctr="" ;;
            podman) ctr=$(podman create "$ref"); root=$(podman mount "$ctr") ;;
            buildah) ctr=$(buildah from --pull-never "$ref"); root=$(buildah mount "$ctr") ;;
        esac
        # Enroot starts a container with the image's environment from /etc/environment.
        image_env "$ref" | grep -v '^$' >> "$root/etc/environment" || true
        mksquashfs "$root" "$tmp" -noappend -quiet -no-progress "${SQUASH_OPTIONS[@]}" >&2
        case $builder in
            docker) rm -rf "$root" ;;
            podman) podman umount "$ctr" >/dev/null; podman rm "$ctr" >/dev/null ;;
            buildah) buildah umount "$ctr" >/dev/null; buildah rm "$ctr" >/dev/null ;;
        esac
    fi
    mv "$tmp" "$out"
}

mkdir -p "$APPS"
for flavour in "${flavours[@]}"; do
    base=${BASE_IMAGE:-} wheels=""
    if [ "$flavour" = cpu ]; then
        base=$(cpu_base)
        [ "$builder" = docker ] || wheels=$(wheels)
    fi
    ref="localhost/reproflow-$flavour:latest"
    build "$flavour" "$base" "$wheels" "$ref"
    id=$(image_id "$ref")
    out="$APPS/reproflow-$flavour.sqsh"
    if [ -f "$out" ] && [ -f "$out.json" ] && grep -q "\"image_id\": \"$id\"" "$out.json" \
        && (cd "$APPS" && sha256sum --check --status "reproflow-$flavour.sqsh.sha256"); then
        say "$out is already the squash of $ref ($id)"
        continue
    fi
    say "squashing $ref into $out with $squasher"
    rm -f "$out.sha256" "$out.json"
    squash "$ref" "$out"
    (cd "$APPS" && sha256sum "reproflow-$flavour.sqsh" > "reproflow-$flavour.sqsh.sha256")
    # Copies of earlier images that OCI jobs unpacked beside this one (their default OCI_CACHE) are stale.
    sha=$(cut -d' ' -f1 "$out.sha256")
    for unpacked in "$APPS/reproflow-$flavour.oci"/*; do
        name=${unpacked##*/}
        if [ -d "$unpacked" ] && [[ $name =~ ^[0-9a-f]{64}$ ]] && [ "$name" != "$sha" ]; then rm -rf "$unpacked"; fi
    done
    cat > "$out.json" <<EOF
{
  "image": "$ref",
  "image_id": "$id",
  "flavour": "$flavour",
  "base_image": "${base:-$(sed -n 's/^ARG BASE_IMAGE=//p' "$DOCKERFILE")}",
  "builder": "$builder",
  "squashed_with": "$squasher",
  "git_commit": "$(commit)",
  "constraints_sha256": "$(sha256sum constraints.txt | cut -d' ' -f1)"
}
EOF
    say "$out $(cut -d' ' -f1 "$out.sha256") ($(du -h "$out" | cut -f1))"
done
