#!/usr/bin/env bash
# Make sure PostgreSQL server binaries (initdb, postgres) are installed, for the PostgreSQL store tests and bench.
# Idempotent: does nothing when initdb is found (PATH or Debian's /usr/lib/postgresql/*/bin); otherwise runs
# `apt-get update` once and installs Debian's `postgresql` package without starting its default cluster
# (the tests start their own throwaway cluster, see agentlightning/testing/postgres.py). Needs root.
set -euo pipefail

if command -v initdb >/dev/null 2>&1 || compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null; then
    exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
    echo "ensure_postgres.sh: initdb not found and not root; run as root or: sudo apt-get install -y postgresql" >&2
    exit 1
fi
export DEBIAN_FRONTEND=noninteractive
# policy-rc.d 101: the package must not start (or fail to start) a system cluster in a container without systemd.
policy=/usr/sbin/policy-rc.d
created_policy=0
if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' > "$policy" && chmod +x "$policy" && created_policy=1
fi
trap '[ "$created_policy" = 1 ] && rm -f "$policy"' EXIT
apt-get update -q
apt-get install -y -q --no-install-recommends postgresql
compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null || { echo "postgresql installed but initdb missing" >&2; exit 1; }
