#!/usr/bin/env bash
# The test command: set up, then ruff (lint and format), ansible-lint (production profile),
# ansible-test sanity and pytest (unit, integration, and the vLLM-parser check of every rendered
# config).
set -uo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo" || exit 1
bash scripts/setup.sh || exit 1
export PATH="$repo/.venv/bin:$PATH" ANSIBLE_CONFIG="$repo/ansible.cfg"
failed=()
# vLLM's own parser lives in a ~3 GB venv of its own; kept outside the checkout, so that later
# runs on the same machine (and fresh clones there) reuse it. setup.sh builds it when missing.
export GPUFLEET_VLLM_VENV=${GPUFLEET_VLLM_VENV:-$HOME/.cache/gpufleet/vllm-parser-venv-0.33.0}
bash tests/vllm_parser/setup.sh || failed+=("vllm-parser venv")
echo "== ruff (ruff.toml)"
python_dirs=(plugins roles lab tests benchmarks)
ruff check --no-cache "${python_dirs[@]}" || failed+=("ruff check")
ruff format --check --no-cache "${python_dirs[@]}" || failed+=("ruff format")
echo "== ansible-lint (production profile)"
ansible-lint --profile production --nocolor || failed+=(ansible-lint)
echo "== ansible-test sanity"
bash tests/sanity/run.sh || failed+=("ansible-test sanity")
echo "== pytest"
# Two workers (pytest-xdist): the session lab's tests on one, the localhost role runs on the other
# (tests/conftest.py XDIST_GROUPS); the rest wherever a worker is free.
python -m pytest -p no:cacheprovider -n 2 --dist loadgroup "$@" || failed+=(pytest)
if ((${#failed[@]})); then
  echo "FAILED: ${failed[*]}" >&2
  exit 1
fi
