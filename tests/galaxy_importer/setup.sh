#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-3.0-or-later
#
# Create (idempotently) the venv of galaxy-importer, the importer Ansible Galaxy runs on an
# uploaded collection, for tests/integration/test_galaxy_import.py. A second call with the same
# requirements.txt does nothing.
#
# Usage: bash tests/galaxy_importer/setup.sh [VENV_DIR]   (default: <repo>/.venv-importer)
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "${here}/../.." && pwd)"
venv="${1:-${repo}/.venv-importer}"
reqs="${here}/requirements.txt"

if [[ -x "${venv}/bin/ansible-doc" && -x "${venv}/bin/ansible-lint" ]] && cmp -s "${reqs}" "${venv}/.requirements"; then
    exit 0
fi
echo "setup: creating the galaxy-importer venv in ${venv}"
python3 -m venv "${venv}"
"${venv}/bin/pip" install -q --disable-pip-version-check --no-compile -r "${reqs}"
"${venv}/bin/python" -c 'import galaxy_importer.collection'
cp "${reqs}" "${venv}/.requirements"
