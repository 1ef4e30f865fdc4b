#!/usr/bin/env bash
# Set up a fresh machine for this repository: Debian packages the modules and the lab call
# (pciutils: lspci/setpci) and the tests use (shellcheck: ansible-test sanity's shell checks),
# prometheus (promtool) and prometheus-node-exporter for the monitoring role, its tests and the lab,
# debootstrap for the lab's nodes of other Debian releases, then the pinned controller venv in
# .venv. Idempotent.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
debs=(pciutils iproute2 openssh-server openssh-client haproxy systemd git python3 python3-yaml python3-prometheus-client
      shellcheck prometheus prometheus-node-exporter cmake g++ debootstrap)
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
  # --no-compile: pip would byte-compile every file of the `ansible` package's ~90 collections
  # (about two thirds of the install's time); Python compiles the few that are imported on use.
  "$repo/.venv/bin/pip" install -q --disable-pip-version-check --no-compile -r "$repo/requirements.txt"
  cp "$repo/requirements.txt" "$repo/.venv/.requirements"
fi
# ansible.cfg names Mitogen's strategy plugins by this link (the venv's site-packages path depends
# on its Python version).
strategy=$("$repo/.venv/bin/python" -c 'import ansible_mitogen, os; print(os.path.join(os.path.dirname(ansible_mitogen.__file__), "plugins", "strategy"))')
ln -sfn "$strategy" "$repo/.venv/mitogen-strategy"
# The wheelhouse of a node's own boot validation (role boot_validation, boot_validation_wheelhouse):
# the wheels of roles/boot_validation/files/requirements-node.txt for each Python a node's runtime
# may run on (lab/wheelhouse.py: 3.11 to 3.13), downloaded once and cached by the file's hash and
# those versions, so that the lab's nodes (and anything after this step) need no network.
node_reqs=$repo/roles/boot_validation/files/requirements-node.txt
wheelhouse_info=$(cd "$repo" && "$repo/.venv/bin/python" -m lab.wheelhouse)
wheelhouse=${wheelhouse_info% *}
node_pythons=${wheelhouse_info##* }
if [[ ! -d $wheelhouse ]]; then
  echo "setup: downloading the nodes' wheelhouse into $wheelhouse"
  mkdir -p "$(dirname "$wheelhouse")"
  tmp=$(mktemp -d "$wheelhouse.tmp.XXXXXX")
  for version in ${node_pythons//,/ }; do
    "$repo/.venv/bin/pip" download -q --disable-pip-version-check --only-binary=:all: --python-version "$version" \
      -d "$tmp" -r "$node_reqs"
  done
  mv -T "$tmp" "$wheelhouse"
fi
# pytest for the node Pythons (tests/node_pythons): pure-Python wheels that run on 3.9 and 3.13,
# cached by their requirements file's hash.
node_pytest_reqs=$repo/tests/node_pythons/requirements.txt
node_pytest=${XDG_CACHE_HOME:-$HOME/.cache}/gpufleet/node-pytest-$(sha256sum "$node_pytest_reqs" | cut -c1-16)
if [[ ! -d $node_pytest ]]; then
  echo "setup: downloading pytest for the node Pythons into $node_pytest"
  mkdir -p "$(dirname "$node_pytest")"
  tmp=$(mktemp -d "$node_pytest.tmp.XXXXXX")
  "$repo/.venv/bin/pip" download -q --disable-pip-version-check --no-deps --only-binary=:all: \
    --python-version 3.9 --implementation py --abi none --platform any -d "$tmp" -r "$node_pytest_reqs"
  mv -T "$tmp" "$node_pytest"
fi
# The root filesystems of the lab's nodes of other Debian releases (lab/rootfs.py: debootstrap,
# about 2 minutes each, once; cached under ~/.cache/gpufleet/rootfs-<release>-<key>): started in
# the background, one per release, so that they build while the static checks run; whatever needs
# one waits on its build's lock, and builds it itself if this one failed (its log says why).
if [[ $(id -u) -eq 0 ]]; then
  for release in bullseye trixie; do
    if ! "$repo/.venv/bin/python" -c 'import sys, lab.rootfs as r; sys.exit(0 if r.built(sys.argv[1]) else 1)' "$release"; then
      log=${XDG_CACHE_HOME:-$HOME/.cache}/gpufleet/rootfs-$release.log
      echo "setup: building the $release root filesystem in the background (log: $log)"
      (cd "$repo" && setsid "$repo/.venv/bin/python" -m lab.rootfs "$release" >"$log" 2>&1 </dev/null &)
    fi
  done
fi
# galaxy-importer, what Ansible Galaxy runs on an uploaded collection, in a venv of its own
# (.venv-importer: its pins are not the controller's) for tests/integration/test_galaxy_import.py.
bash "$repo/tests/galaxy_importer/setup.sh"
# llama.cpp's llama-server for CPU (role llamacpp_server's tests and the lab's heterogeneous node):
# built once from the pinned source, cached under ~/.cache/gpufleet; a second call does nothing.
bash "$repo/scripts/build-llama-server.sh"
# Each lab node runs systemd, logind and dbus: 5 to 8 inotify instances per node, all charged to
# root; the kernel's default of 128 stops new nodes at about 15 across the machine's labs (a node
# without one dies at boot with an empty console). Large labs (bench_fleet's 16 nodes) need more.
if [[ $(id -u) -eq 0 ]] && (($(sysctl -n fs.inotify.max_user_instances) < 1024)); then
  sysctl -q -w fs.inotify.max_user_instances=1024 ||
    echo "setup: could not raise fs.inotify.max_user_instances; labs of more than ~15 nodes will not boot" >&2
fi
