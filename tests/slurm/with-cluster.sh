#!/usr/bin/env bash
# Run a command (the tests) with the test Slurm cluster up, and stop the cluster afterwards
# whatever the command's outcome. If the cluster cannot start, the Slurm tests are skipped with
# the reason; under CI (CI=true) that is an error instead.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)

if bash "$here/start.sh"; then
    trap 'bash "$here/stop.sh"' EXIT
else
    if [ "${CI:-}" = true ]; then
        echo "with-cluster: the test Slurm cluster did not start; CI needs it (see the output above)" >&2
        exit 1
    fi
    export REPROFLOW_SLURM_UNAVAILABLE="tests/slurm/start.sh could not start a cluster here (needs root and Debian's slurm-wlm packages); see its output"
fi
"$@"
