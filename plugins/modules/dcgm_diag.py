#!/usr/bin/python
# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: dcgm_diag
short_description: Run NVIDIA DCGM's diagnostic (dcgmi diag) and judge it test by test
version_added: 0.1.0
description:
  - Runs C(dcgmi diag -r LEVEL -j [-i GPUS] [-p PARAMETERS]) of NVIDIA's Data Center GPU Manager
    (U(https://github.com/NVIDIA/DCGM)) and turns every test DCGM reports into one GPU health check
    named C(dcgm:<DCGM's test name>) (for example C(dcgm:GPU Memory), C(dcgm:PCIe), 4.x's C(dcgm:pcie),
    C(dcgm:Targeted Power)), with DCGM's own words as its reason.
  - "Reads the JSON document of DCGM 2.x and 3.x (C(DCGM GPU Diagnostic), results per C(gpu_ids))
    and of DCGM 4.x (C(DCGM Diagnostic), results per entity, a C(test_summary) per test) by its
    keys. Where dcgmi prints its text table instead, the table is read by its structure: the
    header row, the category rows, one row per test (C(Pass - All), C(Fail - GPU: 0), 4.x's
    C(GPU0: Pass) rows), and the Warning, Error and Info rows DCGM wraps at the column width."
  - "A test DCGM reports as C(Fail) on any GPU fails the run. C(Warn) warns. C(Skip) warns too,
    with DCGM's reason: a skipped test verified nothing. The action of a failed check comes from
    DCGM's message where it names the cause (row remappings pending: reset the GPU; a missing
    fabric manager, persistence mode or a DCGM internal error: fix the node configuration), else
    from the test (software and deployment tests: fix the configuration; memory, PCIe, stress and
    the rest: drain and inspect the hardware). The mapping and its sources are in the
    collection's docs/dcgm.md."
  - "Fails closed: the task fails, with the full result, on any failed test, output that is neither
    a whole JSON document nor a whole table, a test with a status it does not know, results for
    other GPUs than O(gpus), a non-zero exit without a failed test, the DCGM host engine not
    running (the message says to start C(nvidia-dcgm) or C(nv-hostengine)), and a timeout (the
    whole process group is killed)."
  - When C(dcgmi) is not found the module returns RV(available=false) with the reason; such a
    result never passes, and the task does not fail (the caller decides).
  - Reports C(changed=false); it changes nothing on the host.
author:
  - gpufleet.node developers (@gpufleet)
options:
  level:
    description:
      - DCGM's run level (C(-r)). 1 runs the software and deployment checks (seconds); 2 adds the
        memory and PCIe tests (about 2 minutes); 3 adds the diagnostic, targeted stress, targeted
        power and memory bandwidth tests (about 15 minutes); 4 adds memtest and the pulse test
        (longer), as dcgmi's reference puts them. Which tests a level holds depends on the DCGM release and the GPU.
    type: int
    choices: [1, 2, 3, 4]
    default: 1
  binary:
    description:
      - Path of C(dcgmi), or a name to look up in C(PATH) and C(/usr/bin), C(/usr/local/bin).
    type: path
    default: dcgmi
  gpus:
    description:
      - The GPU indices to run on (C(-i 0,1,...)); unset, DCGM runs on every GPU it manages.
      - When given, DCGM's results must name exactly these GPUs.
    type: list
    elements: int
  parameters:
    description:
      - "DCGM test parameters (C(-p)), as C({test.parameter: value}), rendered sorted as
        C(test.parameter=value;...). For example C(diagnostic.test_duration), C(memtest.test10)."
      - Keys must be C(test.parameter) (letters, digits, underscores); values a number, a boolean
        or a word of letters, digits and C(_.+-).
    type: dict
    default: {}
  timeout:
    description:
      - Seconds the run may take; unset, 300 for level 1, 900 for 2, 3600 for 3 and 7200 for 4. The
        run starts in a new session; on expiry its whole process group is killed and the task fails.
    type: int
attributes:
  check_mode:
    support: partial
    description: Returns the command it would run without running anything.
    details:
      - dcgmi's diagnostics load the GPUs (levels 2 to 4 for minutes to hours), so a check-mode run
        does not run dcgmi at all; it returns RV(status=not_run), RV(passed=null) and the command.
extends_documentation_fragment:
  - gpufleet.node.attributes
notes:
  - Run it on idle GPUs (before the inference server starts, or with it stopped); DCGM refuses or
    fails tests on GPUs that other processes use.
  - The run does not go through C(run_command), which has no timeout; stderr is merged into stdout,
    where dcgmi prints its connection errors.
seealso:
  - module: gpufleet.node.gpu_health_info
  - module: gpufleet.node.nvbandwidth
  - name: DCGM diagnostics
    description: NVIDIA's guide to the DCGM diagnostic levels and tests.
    link: https://docs.nvidia.com/datacenter/dcgm/latest/user-guide/dcgm-diagnostics.html
"""

EXAMPLES = r"""
- name: Quick software and deployment check
  gpufleet.node.dcgm_diag:
    level: 1
  register: dcgm_quick

- name: Medium diagnostic (memory, PCIe) on two GPUs, with a longer limit
  gpufleet.node.dcgm_diag:
    level: 2
    gpus: [0, 1]
    timeout: 1800

- name: Long diagnostic with a shorter diagnostic test
  gpufleet.node.dcgm_diag:
    level: 3
    parameters:
      diagnostic.test_duration: 60
"""

RETURN = r"""
available:
  description: Whether dcgmi was found. When false, RV(reason) says why and RV(passed) is false.
  returned: always
  type: bool
  sample: true
passed:
  description: Whether no check failed (warnings, such as skipped tests, do not fail). C(null) in check mode.
  returned: always
  type: bool
  sample: false
status:
  description:
    - C(pass), C(warn) or C(fail) (the worst of RV(checks)), C(not_run) in check mode,
      C(unavailable) without dcgmi.
  returned: always
  type: str
  sample: fail
reason:
  description: One sentence on the verdict (every failed check with DCGM's words), or why nothing ran.
  returned: always
  type: str
  sample: "dcgm:GPU Memory: GPU 0 Error using CUDA API cuInit ... 'system not yet initialized' ..."
cmd:
  description: The argv that was run (in check mode, that would be); C(null) without dcgmi.
  returned: always
  type: list
  elements: str
  sample: [/usr/bin/dcgmi, diag, -r, "2", -j, -i, "0,1"]
level:
  description: The run level asked for.
  returned: always
  type: int
  sample: 2
dcgm_version:
  description: The DCGM version the output names (C(version), or the table's C(DCGM Version)); C(null) when it names none.
  returned: always
  type: str
  sample: 4.2.3
driver_version:
  description: The driver version DCGM detected (C(Driver Version Detected)); C(null) when it names none.
  returned: always
  type: str
  sample: 580.82.09
format:
  description: How the output was read, C(json) or C(text); C(null) when it was neither (or nothing ran).
  returned: always
  type: str
  sample: json
tests:
  description: Every test of the output as parsed, in DCGM's order.
  returned: always
  type: list
  elements: dict
  contains:
    name: {description: "DCGM's test name, as printed.", type: str}
    category: {description: "DCGM's category (Deployment, Integration, Hardware, Stress, Custom).", type: str}
    status: {description: "The worst of its results and summary: pass, warn, skip, not_run, fail; null when unreadable.", type: str}
    summary_status: {description: "4.x's test_summary status (or the 4.x table's test row), else null.", type: str}
    results:
      description: One per GPU (or entity), or one for every GPU where DCGM names none (C(Pass - All)).
      type: list
      elements: dict
      contains:
        entity: {description: "C(GPU0), C(GPU0,1,2) for a deployment test, null for every GPU.", type: str}
        gpus: {description: "The GPU indices of the result.", type: list, elements: int}
        status: {description: "pass, fail, warn, skip, not_run; null when unknown.", type: str}
        raw_status: {description: "DCGM's status as printed.", type: str}
        warnings: {description: "DCGM's warnings, C({message, error_id}).", type: list, elements: dict}
        info: {description: "DCGM's info lines.", type: list, elements: str}
    warnings: {description: "Warnings that belong to the test, not to one GPU.", type: list, elements: dict}
    info: {description: "Info lines that belong to the test (4.x test_summary).", type: list, elements: str}
checks:
  description:
    - The check records (C(name), C(status), C(gpus), C(reason), C(action)) as the GPU health checks
      write them - C(dcgm_output) (the run and its output), then C(dcgm:<test>) per test.
  returned: always
  type: list
  elements: dict
  sample: [{"name": "dcgm:Persistence Mode", "status": "fail", "gpus": [0],
            "reason": "Persistence mode for GPU 0 is currently disabled. ...", "action": "fix the node configuration"}]
rc:
  description: The exit status of dcgmi.
  returned: when dcgmi exited (not in check mode, not when killed on timeout)
  type: int
  sample: 0
duration_s:
  description: Seconds the run took.
  returned: always
  type: float
  sample: 95.2
timestamp:
  description: Unix time at which the verdict was reached.
  returned: when dcgmi ran
  type: float
stdout:
  description: dcgmi's output (stdout and stderr together), when the run did not pass.
  returned: failure
  type: str
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpufleet.node.plugins.module_utils.common import _proc
from ansible_collections.gpufleet.node.plugins.module_utils.diag import _dcgm_judge

SEARCH_DIRS = ("/usr/bin", "/usr/local/bin")
INSTALL_HINT = "install DCGM (datacenter-gpu-manager)"


def main():
    module = AnsibleModule(
        argument_spec=dict(
            level=dict(type="int", choices=[1, 2, 3, 4], default=1),
            binary=dict(type="path", default="dcgmi"),
            gpus=dict(type="list", elements="int"),
            parameters=dict(type="dict", default={}),
            timeout=dict(type="int"),
        ),
        supports_check_mode=True,
    )
    p = module.params
    try:
        _dcgm_judge.check_options(p["level"], p["gpus"], p["timeout"], p["parameters"])
    except _dcgm_judge.JudgeError as exc:
        module.fail_json(msg=str(exc))
    binary, missing = _proc.find_executable(p["binary"], SEARCH_DIRS, INSTALL_HINT)
    if binary is None:
        module.exit_json(**_dcgm_judge.unavailable(missing, p["level"]))
    if module.check_mode:
        module.exit_json(**_dcgm_judge.not_run(binary, p["level"], p["gpus"], p["parameters"]))
    result = _dcgm_judge.measure(binary, p["level"], p["gpus"], p["parameters"], p["timeout"], _dcgm_judge.run_bounded)
    if not result["passed"]:
        module.fail_json(msg=_dcgm_judge.failure_message(result), **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
