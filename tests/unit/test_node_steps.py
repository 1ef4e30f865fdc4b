# SPDX-License-Identifier: GPL-3.0-or-later
"""One step list for a node (playbooks/tasks/node.yml) in two modes: provision (site.yml,
drift.yml) and boot (validate.yml, the node-boot validation). validate.yml's steps are node.yml's
in boot mode; each mode's steps stay the ones, in the order, that the playbooks ran when they were
two lists."""

from __future__ import annotations

from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
PLAYBOOKS = REPO / "playbooks"
BOOT = "__gpufleet_boot | bool"
PROVISION = "not __gpufleet_boot | bool"

# What validate.yml ran, in order (its steps before they became node.yml's boot mode).
BOOT_STEPS = [
    "Re-apply ACS on the GPUs' paths",
    "Gather the GPU topology",
    "Choose the serving backend (vLLM or llama.cpp) and print why",
    "GPU health (persistence mode, watcher, checks; a failing node stops here)",
    "NCCL all-reduce gate",
    "Start vLLM",
    "Start llama.cpp",
    "Publish vLLM's serving endpoint",
    "Publish llama.cpp's serving endpoint",
    "Register in the balancer",
    "Check that the node may take traffic",
    "Check that the HAProxy agent lets the balancer send traffic",
    "Return the node to rotation",
]
BOOT_RESCUE = [
    "Stop vLLM, the node may not take traffic",
    "Stop llama.cpp, the node may not take traffic",
    "Take the node out of the pool",
    "Stop this node",
]
# What site.yml ran that a boot does not.
PROVISION_ONLY = {
    "PCIe peer path (ACS, IOMMU, boot unit)",
    "Node-boot validation (unit that runs gpufleet.node.validate at every boot)",
    "GPU runtime environment",
    "Serve with vLLM",
    "Serve with llama.cpp",
    "Acceptance load test",
    "Balancer registration",
}


def _node():
    (block, baseline) = yaml.safe_load((PLAYBOOKS / "tasks" / "node.yml").read_text())
    return block, baseline


def _when(task):
    when = task.get("when", [])
    return when if isinstance(when, list) else [when]


def _mode(task):
    when = _when(task)
    return {BOOT: "boot", PROVISION: "provision"}.get(when[0] if when else None, "both")


def _steps(tasks, mode):
    return [t["name"] for t in tasks if _mode(t) in (mode, "both")]


def test_validate_runs_the_node_steps_in_boot_mode():
    (play,) = yaml.safe_load((PLAYBOOKS / "validate.yml").read_text())
    assert play["tasks"] == [
        {
            "name": "Validate the node (the steps of site.yml, in boot mode)",
            "ansible.builtin.import_tasks": "tasks/node.yml",
            "vars": {"gpufleet_node_mode": "boot"},
        }
    ]
    for name in ("site.yml", "drift.yml"):
        text = (PLAYBOOKS / name).read_text()
        assert "import_tasks: tasks/node.yml" in text and "gpufleet_node_mode" not in text, name


def test_the_mode_is_decided_first():
    """A mode's condition comes first, so nothing else of a step is judged in the other mode (a
    boot on the node has no balancer to template)."""
    block, _ = _node()
    assert block["vars"] == {"__gpufleet_boot": "{{ gpufleet_node_mode | default('provision') == 'boot' }}"}
    for task in block["block"] + block["rescue"]:
        assert not any("__gpufleet_boot" in str(c) for c in _when(task)[1:]), task["name"]


def test_each_mode_runs_its_steps_in_order():
    block, baseline = _node()
    assert _steps(block["block"], "boot") == BOOT_STEPS
    provision = _steps(block["block"], "provision")
    assert PROVISION_ONLY <= set(provision) and not set(BOOT_STEPS[0:1] + BOOT_STEPS[5:]) & set(provision)
    assert _steps(block["rescue"], "boot") == BOOT_RESCUE
    assert _steps(block["rescue"], "provision") == ["Take the node out of the pool", "Stop this node"]
    assert baseline["ansible.builtin.import_role"] == {"name": "gpufleet.node.nccl_gate", "tasks_from": "baseline"}


def test_the_check_can_fail():
    """A step added without a mode runs at boot too: the boot list no longer matches."""
    block, _ = _node()
    added = block["block"] + [{"name": "Something new", "ansible.builtin.debug": {}}]
    assert _steps(added, "boot") != BOOT_STEPS
    assert _mode({"when": ["x", BOOT]}) == "both"


def test_a_result_other_steps_read_is_published_by_set_fact_never_by_register():
    """node.yml imports a role in both modes (pcie_p2p whole, then its configure entry point at
    boot): the import its mode skips still runs every `register:` of that file, and a skipped
    task's register overwrites the real result with a skipped one (gpu_runtime_env lost the RDMA
    NICs and NCCL_IB_DISABLE that way). So the roles register only their own private names
    (``__<role>_...``) and publish what others read with set_fact, which sets nothing when skipped."""
    public = []
    for path in sorted((REPO / "roles").glob("*/tasks/*.yml")):
        for task in _tasks(yaml.safe_load(path.read_text()) or []):
            name = task.get("register")
            if name and not name.startswith("__"):
                public.append("%s: register: %s" % (path.relative_to(REPO), name))
    assert not public, "register a private __name and publish it with set_fact:\n" + "\n".join(public)


def _tasks(tasks):
    for task in tasks:
        yield task
        for key in ("block", "rescue", "always"):
            yield from _tasks(task.get(key) or [])
