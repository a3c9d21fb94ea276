#!/usr/bin/env bash
# Usage: check_space.sh VENV_DIR MIN_MB
# Fails at once, with one clear line, when the disk that will hold VENV_DIR has less than MIN_MB free:
# otherwise pip fails minutes later with "[Errno 28] No space left on device" buried under its own
# warnings. SKIP_SPACE_CHECK=1 turns the check off.
set -euo pipefail
venv="$1"
need_mb="$2"
[ "${SKIP_SPACE_CHECK:-0}" = 1 ] && exit 0
[ -d "$venv/lib" ] && exit 0  # already installed: an update needs far less

# Only the venv's own disk: pip installs wheels straight into it, so a small tmpfs /tmp must not stop the install.
parent="$(cd "$(dirname "$venv")" && pwd)"
have="$(df -Pm "$parent" | awk 'NR == 2 { print $4 }')"
if [ -n "$have" ] && [ "$have" -lt "$need_mb" ]; then
  echo "error: $venv needs about ${need_mb} MB free (torch and the frameworks), but $parent has ${have} MB free." >&2
  echo "       Free some space (old clones, venvs, /tmp), or set SKIP_SPACE_CHECK=1 to try anyway." >&2
  exit 1
fi
