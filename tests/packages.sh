#!/usr/bin/env bash
# The system packages `make test` needs beyond the test cluster's (tests/slurm/start.sh installs those),
# from Debian when missing and possible (root with apt):
#   chromium                                 the report page test (tests/test_reproduce.py)
#   libatomic1                               Playwright's driver (its node binary) for that test
#   podman, buildah, mmdebstrap,             building the CPU image (containers/build.sh: podman builds it and
#   squashfs-tools                           `enroot import podman://` squashes it; buildah for the build tests)
#   iproute2                                 the emulated network of local runs (ip, tc: tests/test_network.py)
# Without root or apt nothing is installed; the tests that need a missing one are skipped and say why.
set -uo pipefail
say() { printf 'tests/packages.sh: %s\n' "$*"; }

need=()
command -v chromium >/dev/null || [ -x /usr/lib/chromium/chromium ] || need+=(chromium)
/sbin/ldconfig -p | grep -q 'libatomic\.so\.1 ' || need+=(libatomic1)
for tool in podman:podman buildah:buildah mmdebstrap:mmdebstrap mksquashfs:squashfs-tools tc:iproute2; do
    command -v "${tool%%:*}" >/dev/null || need+=("${tool#*:}")
done
[ ${#need[@]} -gt 0 ] || exit 0
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
    say "missing ${need[*]}, which cannot be installed here (needs root and apt-get); the tests that need them will be skipped"
    exit 0
fi
say "installing Debian's ${need[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null 2>&1 || {
    apt-get update -qq >/dev/null && apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
} || say "installing ${need[*]} failed; the tests that need them will be skipped"
