#!/usr/bin/env bash
# Debian's Chromium for the report page test (tests/test_reproduce.py), installed when missing and
# possible (root with apt); otherwise that test is skipped and says why.
set -uo pipefail
if command -v chromium >/dev/null || [ -x /usr/lib/chromium/chromium ]; then
    exit 0
fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
    echo "tests/chromium.sh: chromium is not installed and cannot be installed here (needs root and apt-get);" \
         "the report page test will be skipped"
    exit 0
fi
echo "tests/chromium.sh: installing Debian's chromium"
export DEBIAN_FRONTEND=noninteractive
apt-get install -y -qq --no-install-recommends chromium >/dev/null 2>&1 || {
    apt-get update -qq >/dev/null && apt-get install -y -qq --no-install-recommends chromium >/dev/null
} || echo "tests/chromium.sh: installing chromium failed; the report page test will be skipped"
