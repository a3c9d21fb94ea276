#!/usr/bin/env bash
# Runs each test environment's suite; fails if any suite fails or collects no test (pytest exit 5).
set -u
cd "$(dirname "$0")/.."
which="${1:-all}"
status=0

run_suite() {
  local name="$1"; shift
  echo "=== test suite: $name ==="
  "$@"
  local rc=$?
  if [ "$rc" -eq 5 ]; then
    echo "=== suite $name collected no tests: failing ===" >&2
    status=1
  elif [ "$rc" -ne 0 ]; then
    echo "=== suite $name failed (exit $rc) ===" >&2
    status=1
  fi
}

if [ "$which" = all ] || [ "$which" = main ]; then
  run_suite main .venv/bin/python -m pytest tests -p no:cacheprovider \
    --ignore=tests/integrations/crewai --ignore=tests/examples/crew --ignore=tests/trainer/verl
fi
if [ "$which" = all ] || [ "$which" = crewai ]; then
  crewai_paths=(tests/integrations/crewai)
  [ -d tests/examples/crew ] && crewai_paths+=(tests/examples/crew)
  run_suite crewai .venv-crewai/bin/python -m pytest "${crewai_paths[@]}" -p no:cacheprovider
fi
if [ "$which" = all ] || [ "$which" = verl ]; then
  run_suite verl .venv-verl/bin/python -m pytest tests/trainer/verl -p no:cacheprovider
fi
exit $status
