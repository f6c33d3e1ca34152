#!/usr/bin/env bash
# make test's CPU image: containers/build.sh cpu into FOLDER (reproflow-cpu.sqsh and its sidecars), built
# by podman and squashed by `enroot import` (tests/enroot-pyxis.sh installs Enroot), with the test
# environment's Python preparing the wheels. Where no builder or squash tool is installed the
# in-container tests are skipped with the reason; under CI (CI=true) that is an error instead.
#   bash tests/cpu-image.sh FOLDER PYTHON
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
folder=$1 python=$2

if ! { command -v buildah || command -v podman || command -v docker; } >/dev/null \
        || ! command -v mksquashfs >/dev/null; then
    echo "tests/cpu-image.sh: no image builder (buildah, podman, docker) or no mksquashfs here; the tests inside the CPU image will be skipped" >&2
    [ "${CI:-}" != true ] || exit 1
    exit 0
fi
start=$SECONDS
APPS=$folder PYTHON=$python bash "$here/../containers/build.sh" cpu || exit 1
echo "tests/cpu-image.sh: $folder/reproflow-cpu.sqsh ready in $((SECONDS - start)) s"
