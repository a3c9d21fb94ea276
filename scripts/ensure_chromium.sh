#!/usr/bin/env bash
# Make sure Debian's Chromium is installed, for the dashboard's browser tests (tests/dashboard/).
# Idempotent: does nothing when /usr/bin/chromium exists; otherwise runs `apt-get update` and installs the
# `chromium` package. Playwright (requirements-dev.txt) drives this binary; `playwright install` is never needed.
# Needs root.
set -euo pipefail

if [ -x /usr/bin/chromium ]; then
    exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
    echo "ensure_chromium.sh: /usr/bin/chromium not found and not root; run as root or: sudo apt-get install -y chromium" >&2
    exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -q
apt-get install -y -q --no-install-recommends chromium
[ -x /usr/bin/chromium ] || { echo "chromium installed but /usr/bin/chromium is missing" >&2; exit 1; }
/usr/bin/chromium --version
