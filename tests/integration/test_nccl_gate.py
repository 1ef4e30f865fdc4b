# SPDX-License-Identifier: GPL-3.0-or-later
"""The nccl_gate role end to end on lab machines with `ansible-playbook -c local`: topology facts
from the nvidia-smi stand-in, ACS cleared by gpufleet.node.pcie_acs through the real setpci, the
all_reduce_perf stand-in measuring what the machine's CURRENT registers allow, and the verdict
read back from the marker, the JSON result and the Prometheus metrics."""

from __future__ import annotations

import json
import shutil
import sys
import uuid
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.harness.playbook import run_playbook

REPO = Path(__file__).resolve().parents[2]
PLAYBOOK = Path(__file__).resolve().parent / "playbooks" / "nccl_gate.yml"

pytestmark = pytest.mark.skipif(not shutil.which("setpci"), reason="pciutils is not installed")


class Fleet:
    """Lab machines as inventory hosts, each with its own tree and its own stand-in for /."""

    def __init__(self, tmp_path, lab_node, profiles):
        self.tmp = tmp_path
        self.nodes = {name: lab_node(profile) for name, profile in profiles.items()}
        lines = ["[lab]"]
        for name, node in self.nodes.items():
            lines.append(
                f"{name} ansible_connection=local ansible_python_interpreter={sys.executable} "
                f"lab_root={node.root} state_dir={self.state(name)}"
            )
        self.inventory = tmp_path / "hosts.ini"
        self.inventory.write_text("\n".join(lines) + "\n")

    def state(self, name):
        return self.tmp / "state" / name

    def run(self, ansible_env, check=False, **extra):
        extra = dict({"repo": str(REPO), "nccl_gate_repeats": 1}, **extra)
        proc = run_playbook(
            PLAYBOOK,
            *(["--check"] if check else []),
            inventory=self.inventory,
            extra_vars=extra,
            env=ansible_env,
            timeout=600,
        )
        return proc, proc.recap

    def marker(self, name):
        return json.loads((self.state(name) / "run/gpufleet/nccl-gate.json").read_text())

    def result(self, name):
        return json.loads((self.state(name) / "var/lib/gpufleet/nccl-gate.json").read_text())

    def metrics(self, name):
        text = (self.state(name) / "var/lib/node_exporter/textfile_collector/gpufleet_nccl.prom").read_text()
        samples = {}
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                samples.setdefault(s.name, []).append((s.labels, s.value))
        return samples

    def boot_id(self, name):
        return (self.nodes[name].root / "proc/sys/kernel/random/boot_id").read_text().strip()

    def reboot(self, name):
        """What a reboot does to the lab machine: firmware ACS defaults back, a new boot id."""
        node = self.nodes[name]
        node.reset_firmware()
        (node.root / "proc/sys/kernel/random/boot_id").write_text(str(uuid.uuid4()) + "\n")


@pytest.mark.slow
def test_acs_on_fails_pcie_acs_clears_it_then_passes(ansible_env, tmp_path, lab_node):
    fleet = Fleet(tmp_path, lab_node, {"seed000": "l40s-4x-switch", "h100": "h100-sxm-8x"})

    # 1. Firmware defaults: ACS redirect on the L40S switches. That node fails its own play, with
    #    measured against expected and the cause; the NVLink node goes on and passes.
    proc, recap = fleet.run(ansible_env)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert recap["seed000"]["failed"] == 1 and recap["h100"]["failed"] == 0
    assert "is under the threshold 20.89 GB/s: under the physics floor 20.89 GB/s (0.85 x the 24.58 GB/s" in proc.stdout
    assert "redirecting bridges: 0000:42:00.0, 0000:42:01.0, 0000:47:00.0, 0000:47:01.0" in proc.stdout

    marker = fleet.marker("seed000")
    assert marker["passed"] is False and marker["kind"] == "low_bandwidth"
    assert marker["boot_id"] == fleet.boot_id("seed000")
    assert marker["threshold_gbps"] == 20.89 and 9 < marker["judged_busbw_gbps"] < 13
    assert marker["rule"] == "physics_floor" and marker["design_key"].startswith("l40s-4x-pcie-")
    result = fleet.result("seed000")
    assert result["passed"] is False and result["host"] == "seed000"
    assert [r["size"] for r in result["rows"]] == [256 << 20, 512 << 20, 1 << 30, 2 << 30, 4 << 30]
    assert result["model"]["worst_link"] == "PHB" and result["expected_busbw_gbps"] == 24.58
    metrics = fleet.metrics("seed000")
    assert metrics["gpufleet_nccl_gate_passed"] == [({"kind": "low_bandwidth"}, 0.0)]
    assert metrics["gpufleet_nccl_gate_threshold_gbps"] == [({}, 20.89)]
    assert metrics["gpufleet_nccl_gate_design_info"] == [
        ({"design_key": marker["design_key"], "rule": "physics_floor"}, 1.0)
    ]
    assert metrics["gpufleet_nccl_gate_physics_floor_gbps"] == [({}, 20.89)]
    assert metrics["gpufleet_nccl_gate_baseline_samples"] == [({}, 0.0)]
    assert metrics["gpufleet_nccl_gate_timestamp_seconds"][0][1] == pytest.approx(result["timestamp"])
    busbw = {(lab["size_bytes"], lab["placement"]): v for lab, v in metrics["gpufleet_nccl_allreduce_busbw_gbps"]}
    assert len(busbw) == 10 and busbw[(str(4 << 30), "in_place")] == result["rows"][-1]["busbw_ip"]
    assert fleet.marker("h100")["passed"] is True
    assert fleet.metrics("h100")["gpufleet_nccl_gate_judged_busbw_gbps"][0][1] > 382.5

    # 2. pcie_acs clears ReqRedir/CmpltRedir/EgressCtrl on the GPU paths: the same gate passes.
    proc, recap = fleet.run(ansible_env, clear_acs=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    marker = fleet.marker("seed000")
    assert marker["passed"] is True and marker["boot_id"] == fleet.boot_id("seed000")
    assert 22.12 <= marker["judged_busbw_gbps"] < 25
    assert fleet.metrics("seed000")["gpufleet_nccl_gate_passed"] == [({"kind": "ok"}, 1.0)]

    # 3. Same boot, passing markers: nothing is measured again, nothing changes.
    before = {n: fleet.marker(n) for n in fleet.nodes}
    proc, recap = fleet.run(ansible_env, clear_acs=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert all(r["changed"] == 0 and r["failed"] == 0 for r in recap.values()), recap
    assert {n: fleet.marker(n) for n in fleet.nodes} == before

    # 4. nccl_gate_force measures again (and rewrites the verdict).
    proc, recap = fleet.run(ansible_env, clear_acs=True, nccl_gate_force=True)
    assert proc.returncode == 0 and recap["seed000"]["changed"] >= 1
    assert fleet.marker("seed000")["timestamp"] > before["seed000"]["timestamp"]

    # 5. A reboot brings the firmware's ACS back and a new boot id: the old marker no longer
    #    counts, the gate measures, and without pcie_acs the node fails again.
    fleet.reboot("seed000")
    proc, recap = fleet.run(ansible_env)
    assert recap["seed000"]["failed"] == 1 and recap["h100"]["changed"] == 0
    marker = fleet.marker("seed000")
    assert marker["passed"] is False and marker["boot_id"] == fleet.boot_id("seed000") != before["seed000"]["boot_id"]


def test_link_trained_down_fails_with_acs_cleared(ansible_env, tmp_path, lab_node):
    fleet = Fleet(tmp_path, lab_node, {"degraded": "l40s-x8-degraded"})
    proc, recap = fleet.run(ansible_env, clear_acs=True)
    assert proc.returncode == 2 and recap["degraded"]["failed"] == 1
    result = fleet.result("degraded")
    assert result["passed"] is False and result["threshold_gbps"] == 20.89
    assert "GPU2 (0000:48:00.0) trained to x8 of x16 below port 0000:47:00.0" in result["reason"]
    assert fleet.metrics("degraded")["gpufleet_nccl_gate_passed"][0][1] == 0.0


def test_check_mode_measures_nothing_and_writes_nothing(ansible_env, tmp_path, lab_node):
    fleet = Fleet(tmp_path, lab_node, {"seed000": "l40s-4x-switch"})
    proc, _recap = fleet.run(ansible_env, check=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert not fleet.state("seed000").exists()


def test_auto_without_topology_stops_in_preflight(ansible_env, tmp_path, lab_node):
    fleet = Fleet(tmp_path, lab_node, {"seed000": "l40s-4x-switch"})
    proc, recap = fleet.run(ansible_env, nccl_gate_topology={})
    assert recap["seed000"]["failed"] == 1
    assert "nccl_gate_min_busbw_gbps is auto but nccl_gate_topology has no GPUs" in proc.stdout
    assert not fleet.state("seed000").exists()


def test_a_gate_that_could_not_run_is_recorded_as_an_error_and_stops_the_host(ansible_env, tmp_path, lab_node):
    # A fixed threshold with neither topology facts nor a GPU count: the module refuses its
    # arguments before it can build the records; the role builds them with the same builder.
    fleet = Fleet(tmp_path, lab_node, {"seed000": "l40s-4x-switch"})
    proc, recap = fleet.run(ansible_env, nccl_gate_topology={}, nccl_gate_min_busbw_gbps="22")
    assert proc.returncode == 2 and recap["seed000"]["failed"] == 1, proc.stdout + proc.stderr
    marker = fleet.marker("seed000")
    assert marker["kind"] == "error" and marker["passed"] is False
    assert "one of the following is required: gpus, topology" in marker["reason"]
    assert marker["boot_id"] == fleet.boot_id("seed000") and marker["judged_busbw_gbps"] is None
    assert marker["result_path"].endswith("var/lib/gpufleet/nccl-gate.json")
    result = fleet.result("seed000")
    assert result["host"] == "seed000" and result["kind"] == "error" and result["rows"] == []
    assert fleet.metrics("seed000")["gpufleet_nccl_gate_passed"] == [({"kind": "error"}, 0.0)]
