#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-3.0-or-later
#
# Create (idempotently) the venv that holds vLLM 0.33.0's own argument parser, so that
# tests/vllm_parser/ can check every config the vllm_server role renders against it.
# No GPU is needed: the vLLM wheel goes in with --no-deps next to a CPU torch, plus the
# pure-Python packages that importing vLLM's CLI argument code pulls in.
#
# Usage: bash tests/vllm_parser/setup.sh [VENV_DIR]   (default: <repo>/.vllm-venv)
# Size: about 3 GB on disk (torch is most of it).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "${here}/../.." && pwd)"
venv="${1:-${GPUFLEET_VLLM_VENV:-${repo}/.vllm-venv}}"
vllm_version="0.33.0"
torch_version="2.13.0"
python="${PYTHON:-python3.11}"

stamp="${venv}/.gpufleet-vllm-${vllm_version}"
if [[ -f "${stamp}" ]] && "${venv}/bin/python" -c 'import vllm' >/dev/null 2>&1; then
    echo "vllm ${vllm_version} parser venv ready: ${venv}"
    exit 0
fi

[[ -x "${venv}/bin/python" ]] || "${python}" -m venv "${venv}"
pip=("${venv}/bin/python" -m pip install --quiet --disable-pip-version-check)

# CPU torch: pip finds the wheel on this machine's disk (find-links) or on the CPU index.
"${pip[@]}" "torch==${torch_version}" \
    || "${pip[@]}" --index-url https://download.pytorch.org/whl/cpu "torch==${torch_version}"
"${pip[@]}" --no-deps "vllm==${vllm_version}"
# What `import vllm.entrypoints.openai.cli_args` and the engine argument classes import.
"${pip[@]}" -r "${here}/requirements-parser.txt"

export VLLM_TARGET_DEVICE=cpu
"${venv}/bin/python" "${here}/parse_config.py" --self-test
touch "${stamp}"
echo "vllm ${vllm_version} parser venv ready: ${venv}"
