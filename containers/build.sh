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
# The gpu flavour: its third-party sources come from a source mirror folder (THIRD_PARTY, default
# ../shared/third-party beside the checkout: pinned tarballs) mounted at /opt/sources with podman or buildah,
# else from upstream (containers/fetch-source.sh); its pins are checked first (containers/pins.py).
# CUDA_STANDIN=1 builds it where NVIDIA's registry and AWS's EFA installer cannot be reached: the base is
# containers/cuda-standin.Dockerfile on the cpu flavour's Debian base, torch comes from PyPI (its CUDA build),
# and the EFA installer is skipped (SKIP=efa-installer: libfabric from source in its place), each recorded in
# the sidecar. Each build step's seconds go to $APPS/.build-reproflow-<flavour>.steps.
set -euo pipefail
shopt -s inherit_errexit
cd "$(dirname "$0")/.."
: "${APPS:=/apps}"
: "${PYTHON:=python3}"
: "${THIRD_PARTY:=../shared/third-party}"
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
case $builder in
    docker) build_command=(docker build) ;;
    # Docker's image format: in OCI's, podman and buildah ignore SHELL (and with it pipefail). A failed
    # build leaves no working container behind (--force-rm).
    podman) build_command=(podman build --format docker --layers --force-rm --isolation chroot) ;;
    buildah) build_command=(buildah bud --format docker --layers --force-rm --isolation chroot) ;;
esac
# pip inside a podman or buildah build of the gpu flavour trusts what this machine's pip trusts (BUILD_CA,
# default the cert of its pip configuration: a proxy's or a site's CA): the file and a pip.conf naming it are
# mounted for the build's steps only (as empty files they stay in the image). Docker builds use their own
# engine's settings.
trust=()
if [[ " ${flavours[*]} " == *" gpu "* ]] && [ -z "${BUILD_CA+set}" ]; then
    BUILD_CA=${PIP_CERT:-$("$PYTHON" -m pip config list 2>/dev/null | sed -n "s/^global\.cert='\(.*\)'$/\1/p" | tail -n 1)}
fi
if [ -n "${BUILD_CA:-}" ] && [ "$builder" != docker ]; then
    [ -f "$BUILD_CA" ] || die "BUILD_CA=$BUILD_CA does not exist: name a CA bundle file, or BUILD_CA= for none"
    trust_dir=$(mktemp -d)
    trap 'rm -rf "$trust_dir"' EXIT
    printf '[global]\ncert = /etc/ssl/certs/build-host-ca.crt\n' > "$trust_dir/pip.conf"
    trust=(--volume "$(realpath "$BUILD_CA"):/etc/ssl/certs/build-host-ca.crt:ro" --volume "$trust_dir/pip.conf:/etc/pip.conf:ro")
fi
# mksquashfs by hand stays for what enroot cannot import from: buildah's images, or no enroot at all.
squasher=mksquashfs
if command -v enroot >/dev/null && [ "$builder" != buildah ]; then squasher="enroot $(enroot version)"
elif ! command -v mksquashfs >/dev/null; then
    die "nothing here makes a squash file: install enroot (github.com/NVIDIA/enroot/releases) or squashfs-tools (mksquashfs)"
fi

build() {  # build FLAVOUR BASE WHEELS REF [BUILD-ARG ...]: the image; on failure, the step that failed
    local flavour=$1 base=$2 wheels=$3 ref=$4 log="$APPS/.build-reproflow-$1.log"
    local args=(--target image -f "$DOCKERFILE" -t "$ref" --build-arg "STACK=$flavour-stack"
                --build-arg "REPROFLOW_GIT_COMMIT=$revision")
    shift 4
    for arg in "$@"; do args+=(--build-arg "$arg"); done
    [ -z "$base" ] || args+=(--build-arg "BASE_IMAGE=$base")
    if [ "$flavour" = cpu ]; then args+=(--build-arg "TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu"); fi
    if [ -n "$wheels" ]; then args+=(--build-arg PIP_NO_INDEX=1 --volume "$wheels:/opt/wheels:ro"); fi
    if [ "$flavour" = gpu ] && [ -d "$THIRD_PARTY" ] && [ "$builder" != docker ]; then
        args+=(--volume "$(cd "$THIRD_PARTY" && pwd):/opt/sources:ro")
    fi
    say "building $ref with $builder (log: $log)"
    [ "$flavour" = cpu ] || args+=("${trust[@]}")  # the cpu flavour's pip reads only its prepared wheels
    if ! "${build_command[@]}" "${args[@]}" . 2>&1 | timed "$APPS/.build-reproflow-$flavour.steps" >"$log"; then
        local step
        step=$(grep -E '^(\[[0-9]+/[0-9]+\] )?STEP [0-9]+/[0-9]+|^#[0-9]+ \[' "$log" | tail -n 1 || true)
        tail -n 15 "$log" >&2
        die "building reproflow-$flavour failed at ${step:-an unknown step}; the whole log: $log"
    fi
}

timed() {  # timed STEPS: the build's output passed on; each step's seconds written to STEPS
    local line step="" started=$SECONDS
    : > "$1"
    while IFS= read -r line; do
        printf '%s\n' "$line"
        if [[ $line =~ ^(\[[0-9]+/[0-9]+\]\ )?STEP\ [0-9]+/[0-9]+:\ (.*)$ ]]; then
            [ -z "$step" ] || printf '%5d s  %s\n' $((SECONDS - started)) "${step:0:110}" >> "$1"
            step=${BASH_REMATCH[2]} started=$SECONDS
        fi
    done
    [ -z "$step" ] || printf '%5d s  %s\n' $((SECONDS - started)) "${step:0:110}" >> "$1"
}

commit() {  # the checkout's commit, -dirty when tracked files changed (as result rows record it)
    local sha
    sha=$(git rev-parse HEAD 2>/dev/null) || { echo unknown; return; }
    [ -z "$(git status --porcelain --untracked-files=no 2>/dev/null)" ] || sha+=-dirty
    echo "$sha"
}
# Read once, for the image's environment and its .json alike: a checkout edited while the image builds
# would give the two different commits.
revision=$(commit)

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

standin_base() {  # the gpu flavour's stand-in base: the CUDA toolchain's wheels on the cpu flavour's Debian
    local debian tag log="$APPS/.build-reproflow-cuda-standin.log"
    debian=$(cpu_base)
    tag=localhost/reproflow-cuda-standin:$(sed -n 's/^ARG CUDA_TOOLKIT_VERSION=//p' containers/cuda-standin.Dockerfile)
    say "building the stand-in CUDA base $tag (log: $log)" >&2
    "${build_command[@]}" "${trust[@]}" -f containers/cuda-standin.Dockerfile -t "$tag" --build-arg "DEBIAN_BASE=$debian" \
        containers 2>&1 | timed "$APPS/.build-reproflow-cuda-standin.steps" >"$log" \
        || { tail -n 15 "$log" >&2; die "building the stand-in CUDA base failed; the whole log: $log"; }
    echo "$tag"
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
    base=${BASE_IMAGE:-} wheels="" extra=() skipped=""
    if [ "$flavour" = cpu ]; then
        base=$(cpu_base)
        [ "$builder" = docker ] || wheels=$(wheels)
    else
        "$PYTHON" containers/pins.py >&2 || die "the gpu flavour's pins disagree (above): fix containers/reproflow.Dockerfile"
        [ -d "$THIRD_PARTY" ] && [ "$builder" != docker ] && say "third-party sources: the mirror $THIRD_PARTY first"
        if [ "${CUDA_STANDIN:-0}" = 1 ]; then
            base=$(standin_base)
            # PyPI's torch at the locked version is the CUDA build the Dockerfile's index serves.
            extra=(TORCH_INDEX_URL=https://pypi.org/simple)
            efa=https://efa-installer.amazonaws.com/aws-efa-installer-$(sed -n 's/^ARG EFA_INSTALLER_VERSION=//p' "$DOCKERFILE").tar.gz
            if ! answer=$(curl -fsSI --max-time 20 "$efa" 2>&1 >/dev/null); then
                extra+=(SKIP=efa-installer)
                skipped="\"efa-installer\": \"$efa did not answer here (${answer//\"/\'}): libfabric "
                skipped+="$(sed -n 's/^ARG LIBFABRIC_VERSION=//p' "$DOCKERFILE") built from source with the EFA provider in its place\""
                say "skipping the EFA installer: $efa did not answer ($answer)"
            fi
        fi
    fi
    ref="localhost/reproflow-$flavour:latest"
    build "$flavour" "$base" "$wheels" "$ref" "${extra[@]}"
    say "step times: $APPS/.build-reproflow-$flavour.steps"
    id=$(image_id "$ref")
    out="$APPS/reproflow-$flavour.sqsh"
    if [ -f "$out" ] && [ -f "$out.json" ] && grep -q "\"image_id\": \"$id\"" "$out.json" \
        && (cd "$APPS" && sha256sum --check --status "reproflow-$flavour.sqsh.sha256"); then
        say "$out is already the squash of $ref ($id)"
        continue
    fi
    say "squashing $ref into $out with $squasher"
    rm -f "$out.sha256" "$out.json"
    squashed=$SECONDS
    squash "$ref" "$out"
    squashed=$((SECONDS - squashed))
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
  "git_commit": "$revision",
  "constraints_sha256": "$(sha256sum constraints.txt | cut -d' ' -f1)",
  "skipped": {${skipped}}
}
EOF
    say "$out $(cut -d' ' -f1 "$out.sha256") ($(du -h "$out" | cut -f1), squashed in $squashed s)"
done
