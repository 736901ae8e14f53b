#!/usr/bin/env bash
# The test command of the README (`make test`): ruff (configured in pyproject.toml), then
# pytest. Without arguments both run over the whole workspace and either failing fails the
# run; with arguments (`tools/run_tests.sh test/test_x.py -k name`) only pytest runs, on
# what they select. pytest's exit code 5 (no test collected) is a failure here: a run that
# tested nothing must not pass.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
lint_rc=0
if [[ $# == 0 ]]; then
  "$ROOT/tools/in_env.sh" ruff check --no-cache "$ROOT"
  lint_rc=$?
  if [[ $lint_rc != 0 ]]; then
    echo "ERROR: ruff found the problems above (rules: pyproject.toml); the tests run anyway" >&2
  fi
fi
"$ROOT/tools/in_env.sh" python -m pytest "$@"
rc=$?
if [[ $rc == 5 ]]; then
  echo "ERROR: pytest collected no tests; check testpaths in pytest.ini" >&2
  exit 1
fi
if [[ $rc == 0 && $lint_rc != 0 ]]; then
  exit 1
fi
exit $rc
