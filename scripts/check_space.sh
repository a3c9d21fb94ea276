#!/usr/bin/env bash
# Usage: check_space.sh VENV_DIR MIN_MB
# Fails at once, with one clear line, when the disk that will hold VENV_DIR (or pip's temporary
# directory) has less than MIN_MB free: otherwise pip fails minutes later with "[Errno 28] No space
# left on device" buried under its own warnings. SKIP_SPACE_CHECK=1 turns the check off.
set -euo pipefail
venv="$1"
need_mb="$2"
[ "${SKIP_SPACE_CHECK:-0}" = 1 ] && exit 0
[ -d "$venv/lib" ] && exit 0  # already installed: an update needs far less

free_mb() {
  df -Pm "$1" | awk 'NR == 2 { print $4 }'
}

parent="$(dirname "$venv")"
tmp="${TMPDIR:-/tmp}"
for dir in "$parent" "$tmp"; do
  [ -d "$dir" ] || continue
  have="$(free_mb "$dir")"
  if [ -n "$have" ] && [ "$have" -lt "$need_mb" ]; then
    echo "error: $venv needs about ${need_mb} MB free (torch and the frameworks), but $(cd "$dir" && pwd) has ${have} MB free." >&2
    echo "       Free some space (old clones, venvs, /tmp), or set SKIP_SPACE_CHECK=1 to try anyway." >&2
    exit 1
  fi
done
