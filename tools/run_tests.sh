#!/usr/bin/env bash
# The test command of the README (`make test`). pytest's exit code 5 (no test collected)
# is a failure here: a run that tested nothing must not pass.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
"$ROOT/tools/in_env.sh" python -m pytest "$@"
rc=$?
if [[ $rc == 5 ]]; then
  echo "ERROR: pytest collected no tests; check testpaths in pytest.ini" >&2
  exit 1
fi
exit $rc
