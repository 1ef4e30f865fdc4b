#!/usr/bin/env bash
# The main job, on the lab: set up, bring up the default lab fleet (four simulated GPU nodes and
# an HAProxy), run playbooks/site.yml against it, and print the fleet report. Exits 0 when every
# node ended where a correct run must leave it (the degraded node out of the pool included).
# Bring the lab down afterwards with: .venv/bin/python -m lab down
set -uo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo" || exit 1
bash scripts/setup.sh || exit 1
export PATH="$repo/.venv/bin:$PATH" ANSIBLE_CONFIG="$repo/ansible.cfg"
if python -m lab status --json | python -c 'import json,sys; sys.exit(0 if json.load(sys.stdin)["up"] else 1)'; then
  echo "== the lab is already up; using it"
  python -m lab inventory >/dev/null || exit 1
else
  echo "== lab up"
  python -m lab up || exit 1
fi
echo "== ansible-playbook playbooks/site.yml"
ansible-playbook -i inventories/lab/hosts.yml playbooks/site.yml
site_rc=$?
echo "== fleet report (site.yml exit status $site_rc: a node that must stay out fails its play)"
python -m lab report
