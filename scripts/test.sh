#!/usr/bin/env bash
# The test command: set up, then ruff (lint and format), ansible-lint (production profile),
# ansible-test sanity and pytest (unit, integration, lab, fleet, and the vLLM-parser check of every
# rendered config).
set -uo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo" || exit 1
bash scripts/setup.sh || exit 1
export PATH="$repo/.venv/bin:$PATH" ANSIBLE_CONFIG="$repo/ansible.cfg"
# Python's default, bytecode cached in __pycache__ (git-ignored), whatever the calling environment
# says: with PYTHONDONTWRITEBYTECODE set (these machines set it), every ansible-playbook run, lab
# command and stand-in call compiles the collection's and the lab's sources again, about 15 % of
# the suite's CPU (docs/performance.md).
unset PYTHONDONTWRITEBYTECODE
# Every tier runs: a test whose prerequisite is missing (a lab that cannot boot, a package) fails
# instead of skipping (tests/conftest.py).
export GPUFLEET_TESTS_STRICT=1
failed=()
# vLLM's own parser lives in a ~3 GB venv of its own; kept outside the checkout, so that later
# runs on the same machine (and fresh clones there) reuse it. setup.sh builds it when missing.
export GPUFLEET_VLLM_VENV=${GPUFLEET_VLLM_VENV:-$HOME/.cache/gpufleet/vllm-parser-venv-0.33.0}
bash tests/vllm_parser/setup.sh || failed+=("vllm-parser venv")
# Two lanes side by side, one per core; the second's output is printed after the first's. The
# tests that boot labs (marker needs_lab: the session's lab and the modules with labs of their own,
# whose playbook runs wait on the nodes as much as they compute) start at once; the other lane runs
# the static checks (ruff, ansible-lint, ansible-test sanity), then every other test. (pytest-xdist's
# loadgroup cannot keep the session lab's tests on one worker under pytest 9.) pytest's exit status
# 5 is "nothing selected" for one lane. The lane's static checks write their status to $static_rc_file,
# its pytest's is the lane's own.
static_and_rest() {
  local rc=0
  echo "== ruff (ruff.toml)"
  local python_dirs=(plugins roles lab tests benchmarks)
  ruff check --no-cache "${python_dirs[@]}" || rc=1
  ruff format --check --no-cache "${python_dirs[@]}" || rc=1
  echo "== ansible-lint (production profile)"
  ansible-lint --profile production --nocolor || rc=1
  echo "== ansible-test sanity"
  bash tests/sanity/run.sh || rc=1
  echo "== pytest, the tests that boot no lab"
  python -m pytest -p no:cacheprovider --durations=20 -m "not needs_lab" "$@"
  local pytest_rc=$?
  echo "== exit: static checks $rc, pytest $pytest_rc"
  echo "$rc" >"$static_rc_file"
  return "$pytest_rc"
}
rest_log=$(mktemp)
static_rc_file=$(mktemp)
static_and_rest "$@" >"$rest_log" 2>&1 &
rest=$!
echo "== pytest, the tests that boot labs"
python -m pytest -p no:cacheprovider --durations=20 -m needs_lab "$@"
labs_rc=$?
wait "$rest"
rest_pytest_rc=$?
cat "$rest_log"
static_rc=$(<"$static_rc_file")
static_rc=${static_rc:-1} # no status written: the lane died before its end
rm -f "$rest_log" "$static_rc_file"
((static_rc == 0)) || failed+=("static checks (ruff, ansible-lint or sanity: see above)")
if ((labs_rc == 5 && rest_pytest_rc == 5)); then
  failed+=("pytest (no test selected)")
else
  ((labs_rc == 0 || labs_rc == 5)) || failed+=("pytest (labs)")
  ((rest_pytest_rc == 0 || rest_pytest_rc == 5)) || failed+=("pytest (no lab)")
fi
if ((${#failed[@]})); then
  echo "FAILED: ${failed[*]}" >&2
  exit 1
fi
