#!/usr/bin/env bash
# Set up a fresh machine for this repository: Debian packages the modules and the lab call
# (pciutils: lspci/setpci) and the tests use (shellcheck: ansible-test sanity's shell checks),
# prometheus (promtool) and prometheus-node-exporter for the monitoring role, its tests and the lab,
# then the pinned controller venv in .venv. Idempotent.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
debs=(pciutils iproute2 openssh-server openssh-client haproxy systemd git python3 python3-yaml python3-prometheus-client
      shellcheck prometheus prometheus-node-exporter)
missing=()
for pkg in "${debs[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if ((${#missing[@]})); then
  if [[ $(id -u) -ne 0 ]]; then
    echo "setup: missing Debian packages: ${missing[*]}; run as root or: sudo apt-get install ${missing[*]}" >&2
    exit 1
  fi
  echo "setup: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
if [[ ! -x $repo/.venv/bin/ansible-playbook ]] || ! cmp -s "$repo/requirements.txt" "$repo/.venv/.requirements"; then
  echo "setup: creating the controller venv in .venv"
  python3 -m venv "$repo/.venv"
  "$repo/.venv/bin/pip" install -q --disable-pip-version-check --upgrade pip
  "$repo/.venv/bin/pip" install -q --disable-pip-version-check -r "$repo/requirements.txt"
  cp "$repo/requirements.txt" "$repo/.venv/.requirements"
fi
# ansible.cfg names Mitogen's strategy plugins by this link (the venv's site-packages path depends
# on its Python version).
strategy=$("$repo/.venv/bin/python" -c 'import ansible_mitogen, os; print(os.path.join(os.path.dirname(ansible_mitogen.__file__), "plugins", "strategy"))')
ln -sfn "$strategy" "$repo/.venv/mitogen-strategy"
