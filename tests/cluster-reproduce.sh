#!/usr/bin/env bash
# The whole reproduction as a cluster user runs it, on the test cluster (tests/slurm/start.sh): the CPU
# image built and squashed by Enroot (make test-setup), five nodes on shaped 1 Gbit/s links (resharding's
# suites place five hosts; each node declares 8 CPUs on this machine's cores, as make demo runs 20 ranks
# on 2), then `make reproduce EXECUTOR=slurm IMAGE=<the image>`: reproflow doctor, every step's jobs in
# the image through Pyxis, waited for and retried, the figures and the report. Then, where a local
# make demo's rows and claims are at hand (LOCAL, default results/ and reports/ of this checkout),
# `reproflow compare` of the two runs, metric by metric and claim by claim.
# Usage: tests/cluster-reproduce.sh [OUT]    (make cluster-reproduce; OUT default cluster-run/; ONLY=targets
# as make reproduce takes them)
# Rerun after a failure, it submits only what is not measured. The test cluster stays up until the end.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
OUT=$(mkdir -p "${1:-$repo/cluster-run}" && cd "${1:-$repo/cluster-run}" && pwd)
LOCAL=${LOCAL:-$repo}
say() { printf 'cluster-reproduce: %s\n' "$*"; }

cd "$repo"
make test-setup
# One job at a time: the five nodes share this machine's cores, so jobs run side by side would time each
# other (their timings would differ by what ran beside them); a cluster's nodes do not.
export LOCAL_SLURM_NODES=5 LOCAL_SLURM_CPUS=8 LOCAL_SLURM_JOBS=${LOCAL_SLURM_JOBS:-1}
bash tests/slurm/start.sh
trap 'bash tests/slurm/stop.sh' EXIT
start=$SECONDS
rc=0
make reproduce EXECUTOR=slurm IMAGE="$repo/.local-images/reproflow-cpu.sqsh" \
    RESULTS="$OUT/results" REPORTS="$OUT/reports" LOGS="$OUT/logs" || rc=$?
say "make reproduce EXECUTOR=slurm exited $rc after $(( (SECONDS - start) / 60 )) min $(( (SECONDS - start) % 60 )) s"
if [ -s "$LOCAL/reports/claims.csv" ] && [ -d "$LOCAL/results" ]; then
    .venv/bin/reproflow compare "$LOCAL/results" "$OUT/results" --out "$OUT/compare" \
        --claims "$LOCAL/reports/claims.csv" "$OUT/reports/claims.csv" || true
    say "the local run ($LOCAL) against this one: $OUT/compare/compare.md"
else
    say "no local make demo run under $LOCAL (results/, reports/claims.csv): nothing to compare with"
fi
exit $rc
