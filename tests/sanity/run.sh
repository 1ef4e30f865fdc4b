#!/usr/bin/env bash
# ansible-test sanity on the collection, Python 3.11, in per-test virtual environments made by ansible-test.
# ansible-test needs the collection at .../ansible_collections/gpufleet/node, so the tracked
# and new (not ignored) files are copied there first. Extra arguments go to ansible-test
# (e.g. a list of files, or --test validate-modules).
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
# ansible-test's --venv mode downloads a pip bootstrap script from a host these machines cannot
# reach, so the sanity tools get a venv of their own (.venv-sanity) and run in it with --local.
venv=$repo/.venv-sanity
if [[ ! -x $venv/bin/ansible-test ]]; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check "$(grep '^ansible-core==' "$repo/requirements.txt")"
fi
work=$(mktemp -d -t gpufleet-sanity.XXXXXX)
trap 'rm -rf "$work"' EXIT
dest=$work/ansible_collections/gpufleet/node
# ansible-test bootstraps pip in each of its venvs with a script it downloads; give it ours.
pip_version=$(grep -oP "^\s+pip='\K[0-9.]+" "$venv"/lib/python3*/site-packages/ansible_test/_internal/python_requirements.py)
mkdir -p ~/.ansible/test/cache
cp "$repo/tests/sanity/get_pip.py" ~/.ansible/test/cache/"get_pip_${pip_version//./_}.py"
mkdir -p "$dest"
# The collection, without the lab or what git ignores; ansible-test reads only what is here
# (tracked files deleted in the working tree are left out).
(cd "$repo" && git ls-files -co --exclude-standard -z \
   | grep -zv -e '^\.collections/' -e '^lab/' -e '^benchmarks/' -e '^\.ci/' \
   | while IFS= read -r -d '' f; do [[ -e $f ]] && printf '%s\0' "$f"; done \
   | tar --null -T - -cf -) | tar -xf - -C "$dest"
cd "$dest"
git init -q . && git add -A >/dev/null
"$venv/bin/ansible-test" sanity --local --python 3.11 --requirements \
  --exclude tests/ --color no "$@"
