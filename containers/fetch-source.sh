#!/usr/bin/env bash
# The one place the gpu image takes a third-party source from, pinned:
#   fetch-source DEST PIN URL [URL ...]
# PIN is a git commit (40 hex digits) or sha256:<hex> of a release tarball. A source mirror folder is tried
# first (SOURCE_MIRROR, default /opt/sources: make containers mounts its THIRD_PARTY folder there; a
# `git archive` tarball whose embedded commit is PIN, or a file whose sha256 is PIN), then each URL in turn: a
# git repository fetched at PIN, or a tarball checked against PIN. DEST receives the tree (its top folder
# stripped). What was tried is said when nothing matches.
set -euo pipefail
[ $# -ge 3 ] || { echo "usage: fetch-source DEST PIN URL [URL ...]" >&2; exit 2; }
dest=$1 pin=$2
shift 2
mirror=${SOURCE_MIRROR:-/opt/sources}
say() { printf 'fetch-source: %s\n' "$*" >&2; }

unpack() {  # unpack TARBALL: into DEST, without its top folder
    mkdir -p "$dest"
    tar -xf "$1" -C "$dest" --strip-components=1
}

case $pin in
    sha256:*) want=${pin#sha256:}; kind=tarball ;;
    *) [[ $pin =~ ^[0-9a-f]{40}$ ]] || { say "PIN '$pin' is neither a 40-digit commit nor sha256:<hex>"; exit 2; }
       want=$pin; kind=commit ;;
esac

# The mirror: a tarball matching the pin, whatever its name.
if [ -d "$mirror" ]; then
    for file in "$mirror"/*.tar.*; do
        [ -f "$file" ] || continue
        if [ $kind = commit ]; then
            # git archive records the commit in the tarball's header.
            found=$(zcat -f "$file" 2>/dev/null | git get-tar-commit-id 2>/dev/null || true)
        else
            found=$(sha256sum "$file" | cut -d' ' -f1)
        fi
        if [ "$found" = "$want" ]; then
            unpack "$file"
            say "$pin from the mirror's ${file##*/}"
            exit 0
        fi
    done
fi

tried=("$mirror (no tarball at this pin)")
for url in "$@"; do
    work=$(mktemp -d)
    if [ $kind = commit ]; then
        if git init -q "$work/src" && git -C "$work/src" fetch -q --depth 1 "$url" "$want" 2>"$work/log" \
            && git -C "$work/src" -c advice.detachedHead=false checkout -q FETCH_HEAD \
            && [ "$(git -C "$work/src" rev-parse HEAD)" = "$want" ]; then
            rm -rf "$work/src/.git"
            mkdir -p "$dest"
            cp -a "$work/src/." "$dest/"
            rm -rf "$work"
            say "$pin from $url"
            exit 0
        fi
    elif curl -fsSL --retry 2 -o "$work/source" "$url" 2>"$work/log"; then
        if [ "$(sha256sum "$work/source" | cut -d' ' -f1)" = "$want" ]; then
            unpack "$work/source"
            rm -rf "$work"
            say "$pin from $url"
            exit 0
        fi
        echo "its sha256 is not $want" > "$work/log"
    fi
    tried+=("$url ($(tail -n 1 "$work/log" 2>/dev/null || echo failed))")
    rm -rf "$work"
done
say "no source at $pin; tried:"
printf '  %s\n' "${tried[@]}" >&2
say "put the pinned tarball in the mirror folder (make containers: THIRD_PARTY=...), or build where a URL answers"
exit 1
