#!/usr/bin/env bash
# Enroot and Pyxis for make test's cluster, as a ParallelCluster node has them: built from source at the
# pinned refs below and installed under PREFIX (default /usr/local): `enroot` in $PREFIX/bin (its
# configuration in $PREFIX/etc/enroot), Pyxis's SPANK plugin $PREFIX/lib/slurm/spank_pyxis.so compiled
# against the installed Slurm's headers (Debian's libslurm-dev), with a build-info file beside its pyxis.conf.
# tests/slurm/start.sh loads the plugin when it is there.
#
# Sources: a source mirror folder first (THIRD_PARTY, default ../shared/third-party beside the checkout:
# `git archive` tarballs <name>-<ref>.tar.gz, Enroot's with its submodules), else `git clone` of upstream at
# the same ref, its commit checked. Installed versions equal to the pinned ones are not built again (Pyxis
# also needs the same Slurm version). Where neither root with apt nor a source is at hand it says why and
# exits 0: the tests that need Pyxis skip with that reason. A build that fails is an error.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
: "${PREFIX:=/usr/local}"
: "${THIRD_PARTY:=$repo/../shared/third-party}"
ENROOT_VERSION=4.1.2 ENROOT_COMMIT=bd51f53b ENROOT_URL=https://github.com/NVIDIA/enroot.git
PYXIS_VERSION=0.24.0 PYXIS_COMMIT=10751994 PYXIS_URL=https://github.com/NVIDIA/pyxis.git
# Build: a C compiler and patch (without patch Enroot's helpers build, linked to a musl loader that does not
# exist); libslurm-dev for Pyxis. Run: what `enroot import` and `enroot create/start` call.
PACKAGES=(gcc make libc6-dev patch file libslurm-dev curl gawk jq squashfs-tools parallel procps bsdextrautils)
say() { printf 'tests/enroot-pyxis.sh: %s\n' "$*"; }
skip() { say "$*; the tests that need Pyxis will be skipped"; exit 0; }
die() { say "$*" >&2; exit 1; }

slurm_version=$(dpkg-query -W -f='${Version}' libslurm-dev 2>/dev/null | cut -d- -f1)
built_for=$PREFIX/share/pyxis/build-info
want_pyxis="pyxis $PYXIS_VERSION slurm ${slurm_version:-unknown}"
have_enroot() { [ "$("$PREFIX/bin/enroot" version 2>/dev/null)" = "$ENROOT_VERSION" ]; }
have_pyxis() {
    [ -n "$slurm_version" ] && [ -f "$PREFIX/lib/slurm/spank_pyxis.so" ] && [ "$(cat "$built_for" 2>/dev/null)" = "$want_pyxis" ]
}
if have_enroot && have_pyxis; then
    say "enroot $ENROOT_VERSION and $want_pyxis already in $PREFIX"
    exit 0
fi

[ "$(id -u)" = 0 ] && command -v apt-get >/dev/null || skip "Enroot and Pyxis are built and installed as root with apt-get"
need=()
for pkg in "${PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || need+=("$pkg")
done
if [ ${#need[@]} -gt 0 ]; then
    say "installing Debian's ${need[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null 2>&1 || {
        apt-get update -qq >/dev/null && apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
    } || skip "installing ${need[*]} failed"
    slurm_version=$(dpkg-query -W -f='${Version}' libslurm-dev | cut -d- -f1)
    want_pyxis="pyxis $PYXIS_VERSION slurm $slurm_version"
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

source_of() {  # source_of NAME VERSION TARBALL URL COMMIT: sets src to the unpacked source; 1 where there is none
    local name=$1 version=$2 tarball=$3 url=$4 commit=$5
    src="$work/$1-$2"
    if [ -f "$THIRD_PARTY/$tarball" ]; then
        tar -xzf "$THIRD_PARTY/$tarball" -C "$work" && [ -d "$src" ] \
            || die "$THIRD_PARTY/$tarball does not unpack into $name-$version/"
        return 0
    fi
    git clone --quiet --depth 1 --branch "v$version" --recurse-submodules --shallow-submodules "$url" "$src" \
        >"$work/$name-clone.log" 2>&1 || return 1
    [[ $(git -C "$src" rev-parse HEAD) == "$commit"* ]] || die "$url v$version is not commit $commit"
}

start=$SECONDS
if ! have_enroot; then
    source_of enroot "$ENROOT_VERSION" "enroot-$ENROOT_VERSION-with-submodules.tar.gz" "$ENROOT_URL" \
        "$ENROOT_COMMIT" || skip "no Enroot $ENROOT_VERSION source: not in $THIRD_PARTY and $ENROOT_URL cannot be cloned"
    say "building enroot $ENROOT_VERSION from $src into $PREFIX"
    make -C "$src" -j"$(nproc)" prefix="$PREFIX" install >"$work/enroot-build.log" 2>&1 \
        || { tail -n 20 "$work/enroot-build.log" >&2; die "building Enroot failed"; }
    file "$PREFIX/bin/enroot-nsenter" | grep -q static-pie \
        || die "Enroot's helpers are not static-pie executables (is patch installed?)"
    have_enroot || die "$PREFIX/bin/enroot does not say version $ENROOT_VERSION"
fi
if ! have_pyxis; then
    source_of pyxis "$PYXIS_VERSION" "pyxis-$PYXIS_VERSION.tar.gz" "$PYXIS_URL" "$PYXIS_COMMIT" \
        || skip "no Pyxis $PYXIS_VERSION source: not in $THIRD_PARTY and $PYXIS_URL cannot be cloned"
    say "building pyxis $PYXIS_VERSION against Slurm $slurm_version into $PREFIX"
    make -C "$src" prefix="$PREFIX" install >"$work/pyxis-build.log" 2>&1 \
        || { tail -n 20 "$work/pyxis-build.log" >&2; die "building Pyxis failed"; }
    echo "$want_pyxis" > "$built_for"
fi
say "enroot $ENROOT_VERSION and $want_pyxis in $PREFIX, built in $((SECONDS - start)) s"
