#!/usr/bin/env bash
# The main job, on the lab: set up, bring up the default lab fleet (five simulated GPU nodes, one served by llama.cpp, and
# an HAProxy, scraped by a Prometheus with the collection's alert rules), run playbooks/site.yml
# against it, print the fleet report and the Prometheus URL, and wait until the NCCL gate alert
# (GpufleetNcclGateFailed; the lab's rules set its `for:` to 5 s, see lab/prometheus.py ALERT_FOR)
# fires for every node that must stay out of the pool. Exits 0 when every node ended where a
# correct run must leave it (the degraded node out of the pool included) and the alert fired.
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
# the inventory's secrets (vllm_server_api_key, vllm_server_hf_token) are vaulted with the lab's password
ANSIBLE_VAULT_PASSWORD_FILE=$(python -c 'from lab.fleet import Fleet; print(Fleet().vault_password_file)') || exit 1
export ANSIBLE_VAULT_PASSWORD_FILE
echo "== ansible-playbook playbooks/site.yml"
ansible-playbook -i inventories/lab/hosts.yml playbooks/site.yml
site_rc=$?
echo "== fleet report (site.yml exit status $site_rc: a node that must stay out fails its play)"
python -m lab report
report_rc=$?
prometheus=$(python -m lab status --json | python -c 'import json,sys; print((json.load(sys.stdin)["prometheus"] or {}).get("url", "none"))')
echo "== Prometheus: $prometheus (alerts: $prometheus/alerts)"
mapfile -t refused < <(python -m lab status --json |
  python -c 'import json,sys; print("\n".join(n["name"] for n in json.load(sys.stdin)["nodes"] if not n["expect_registered"]))')
wait_args=()
for node in "${refused[@]}"; do wait_args+=(--node "$node"); done
echo "== waiting for GpufleetNcclGateFailed to fire for: ${refused[*]:-(no node must stay out)}"
alerts_rc=0
if ((${#refused[@]})); then
  python -m lab alerts --wait GpufleetNcclGateFailed "${wait_args[@]}" --timeout 120 || alerts_rc=$?
else
  python -m lab alerts || alerts_rc=$?
fi
exit $((report_rc || alerts_rc))
