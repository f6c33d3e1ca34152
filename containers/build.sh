#!/usr/bin/env bash
# make containers: build each image with Docker and turn it into an Enroot squash file for Pyxis.
#   bash containers/build.sh [param megatron spatial]     APPS=/apps (a filesystem every node mounts)
# Writes $APPS/reproflow-<name>.sqsh and its sha256 (recorded in every result row of jobs using it).
set -euo pipefail
cd "$(dirname "$0")/.."
: "${APPS:=/apps}"
names=("$@")
[ ${#names[@]} -gt 0 ] || names=(param megatron spatial)

missing=()
command -v docker >/dev/null || missing+=("docker (the Docker CLI and engine: https://docs.docker.com/engine/install/)")
if command -v docker >/dev/null && ! docker info >/dev/null 2>&1; then
    missing+=("a running Docker engine (docker is installed but 'docker info' fails: start dockerd or add your user to the docker group)")
fi
command -v enroot >/dev/null || missing+=("enroot (https://github.com/NVIDIA/enroot/releases)")
if [ ${#missing[@]} -gt 0 ]; then
    echo "make containers: cannot build here; missing:" >&2
    printf '  - %s\n' "${missing[@]}" >&2
    echo "Run it on a cluster node that has Docker and Enroot (e.g. a ParallelCluster head node)." >&2
    exit 1
fi

commit=$(git rev-parse HEAD 2>/dev/null || echo unknown)
tag=$(git rev-parse --short=12 HEAD 2>/dev/null || echo latest)
mkdir -p "$APPS"
for name in "${names[@]}"; do
    [ -f "containers/$name.Dockerfile" ] || { echo "make containers: no containers/$name.Dockerfile" >&2; exit 1; }
    echo "== reproflow-$name:$tag"
    docker build -t "reproflow-$name:$tag" --build-arg "REPROFLOW_GIT_COMMIT=$commit" -f "containers/$name.Dockerfile" .
    rm -f "$APPS/reproflow-$name.sqsh"
    enroot import -o "$APPS/reproflow-$name.sqsh" "dockerd://reproflow-$name:$tag"
    (cd "$APPS" && sha256sum "reproflow-$name.sqsh" > "reproflow-$name.sqsh.sha256")
    echo "   $APPS/reproflow-$name.sqsh $(cut -d' ' -f1 "$APPS/reproflow-$name.sqsh.sha256")"
done
