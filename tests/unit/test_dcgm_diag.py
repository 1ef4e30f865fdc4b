# SPDX-License-Identifier: GPL-3.0-or-later
"""DCGM's ``dcgmi diag`` output read (plugins/module_utils/diag/_dcgm.py) and judged test by test
(plugins/module_utils/diag/_dcgm_judge.py) on the real outputs of tests/data/dcgm, and the module
gpufleet.node.dcgm_diag as Ansible runs it, with a fake dcgmi that records its argv and prints
those outputs.

Cases derived from a real sample (a document cut short, a status word replaced, the GPU list of
another run) say so where they are built; the outputs themselves are never edited on disk."""

from __future__ import annotations

import json
import time

import pytest

from ansible_collections.gpufleet.node.plugins.module_utils.diag import _dcgm as dcgm
from ansible_collections.gpufleet.node.plugins.module_utils.diag import _dcgm_judge as judge_mod
from ansible_collections.gpufleet.node.plugins.module_utils.health import _verdict
from tests.harness import REPO
from tests.harness.modules import run_module

DATA = REPO / "tests" / "data" / "dcgm"

V100_R3 = "dcgm-3.3.9-v100-r3.txt"
V100_R3_VERBOSE = "dcgm-3.3.9-v100-r3-verbose.txt"
H100_CUDA = "dcgm-3.3.8-h100x8-r3-cuda-not-initialized.txt"
RTX_PERSISTENCE = "dcgm-3.x-rtx-r4-persistence-fail.txt"
V423_PCIE = "dcgm-4.2.3-4gpu-r2-pcie-internal-error.txt"
B200_PCIE = "dcgm-4.4.1-b200x8-r2-pcie-internal-error.txt"
V442_PASS = "dcgm-4.4.2-1gpu-r2-pass.txt"
GB10_SKIP = "dcgm-4.4.2-gb10-r3-skip.txt"
NVVS_310 = "dcgm-3.1.0-8gpu-nvvs-deserialize-test.txt"
GB10_JSON = "dcgm-4.2.3-gb10-r1-software-fail.json"
V4_FRAGMENT = "dcgm-4.x-8gpu-r4-diagnostic-fragment.json"
ENGINE_DOWN = "engine-down-discovery.txt"
THERMAL_FRAGMENT = "ml-engineering-r2-gpu0-thermal-fragment.txt"
REMAP_FRAGMENT = "ml-engineering-r3-row-remap-pending-fragment.txt"


def sample(name):
    return (DATA / name).read_text()


def parsed(name):
    return dcgm.parse_output(sample(name))


def by_name(record):
    return {t["name"]: t for t in record["tests"]}


def checks_of(result):
    return {c["name"]: c for c in result["checks"]}


def test_every_sample_has_a_source_entry():
    source = (DATA / "SOURCE").read_text()
    for path in DATA.iterdir():
        if path.name != "SOURCE":
            assert path.name in source, path.name


# == the command ==============================================================================
def test_argv_and_parameters():
    assert dcgm.build_argv("/usr/bin/dcgmi", 2) == ["/usr/bin/dcgmi", "diag", "-r", "2", "-j"]
    assert dcgm.build_argv(
        "dcgmi", 4, [0, 3], {"memtest.test10": True, "diagnostic.test_duration": 60, "pcie.test_pinned": False}
    ) == [
        "dcgmi",
        "diag",
        "-r",
        "4",
        "-j",
        "-i",
        "0,3",
        "-p",
        "diagnostic.test_duration=60;memtest.test10=true;pcie.test_pinned=false",
    ]


@pytest.mark.parametrize(
    ("parameters", "error"),
    [
        ({"diagnostic": 1}, "parameters key 'diagnostic' is not of the form test.parameter"),
        ({"a.b;rm": 1}, "parameters key 'a.b;rm' is not of the form test.parameter"),
        ({"memtest.test0": "true;x.y=1"}, "parameters['memtest.test0'] = 'true;x.y=1': a value must be"),
        ({"memtest.test0": [1]}, "parameters['memtest.test0'] = [1]"),
    ],
)
def test_unsafe_parameters_are_refused(parameters, error):
    with pytest.raises(dcgm.ParameterError) as exc:
        dcgm.render_parameters(parameters)
    assert str(exc.value).startswith(error)


@pytest.mark.parametrize(
    ("args", "error"),
    [
        ((5, None, None, {}), "level must be one of 1, 2, 3, 4, got 5"),
        ((1, [0, 0], None, {}), "gpus names a GPU twice: 0, 0"),
        ((1, [-1], None, {}), "gpus must be GPU indices (0 or more), got [-1]"),
        ((1, None, 0, {}), "timeout must be at least 1 second, got 0"),
        ((1, None, None, {"x": 1}), "parameters key 'x' is not of the form test.parameter"),
    ],
)
def test_options_refused(args, error):
    with pytest.raises(judge_mod.JudgeError) as exc:
        judge_mod.check_options(*args)
    assert str(exc.value).startswith(error)


def test_default_timeouts_scale_with_the_level():
    assert [judge_mod.timeout_for(level, None) for level in (1, 2, 3, 4)] == [300, 900, 3600, 7200]
    assert judge_mod.timeout_for(3, 42) == 42


# == the text table ===========================================================================
def test_v3_table_is_read_exactly():
    r = parsed(V100_R3)
    assert (r["format"], r["problems"], r["engine_down"]) == ("text", [], None)
    assert (r["dcgm_version"], r["driver_version"], r["device_ids"]) == ("3.3.9", "560.35.03", ["1db4"])
    assert r["other_lines"] == ["Successfully ran diagnostic for group."]
    assert [(t["category"], t["name"], t["status"]) for t in r["tests"]] == [
        ("Deployment", "Denylist", "pass"),
        ("Deployment", "NVML Library", "pass"),
        ("Deployment", "CUDA Main Library", "pass"),
        ("Deployment", "Permissions and OS Blocks", "pass"),
        ("Deployment", "Persistence Mode", "pass"),
        ("Deployment", "Environment Variables", "pass"),
        ("Deployment", "Page Retirement/Row Remap", "pass"),
        ("Deployment", "Graphics Processes", "pass"),
        ("Deployment", "Inforom", "pass"),
        ("Integration", "PCIe", "pass"),
        ("Hardware", "GPU Memory", "pass"),
        ("Hardware", "Diagnostic", "pass"),
        ("Stress", "Targeted Stress", "pass"),
        ("Stress", "Targeted Power", "pass"),
        ("Stress", "Memory Bandwidth", "pass"),
        ("Stress", "EUD Test", "skip"),
    ]
    assert by_name(r)["PCIe"]["results"] == [
        {"entity": None, "gpus": [], "status": "pass", "raw_status": "Pass - All", "warnings": [], "info": []}
    ]


def test_wrapped_info_is_rejoined_where_dcgm_cut_it():
    # DCGM cuts every 45 characters, mid-word, and keeps a space at the cut: the rejoined text has
    # neither a stray space ("GP U") nor a lost one.
    tests = by_name(parsed(V100_R3_VERBOSE))
    assert tests["PCIe"]["info"] == [
        "GPU 0 GPU to Host bandwidth: 13.14 GB/s, GPU 0 Host to GPU bandwidth: 12.37 GB/s, GPU 0 bidirectional"
        " bandwidth: 22.42 GB/s, GPU 0 GPU to Host latency: 2.028 us, GPU 0 Host to GPU latency: 2.127 us, GPU 0"
        " bidirectional latency: 3.865 us"
    ]
    assert tests["Targeted Power"]["info"] == ["GPU 0 GPU 0 max power: 251.0 W average power usage: 247.8 W"]
    assert tests["GPU Memory"]["info"] == ["GPU 0 Allocated 16435239282 bytes (97.1%)"]


def test_v3_fail_all_with_per_gpu_warnings():
    r = parsed(H100_CUDA)
    assert (r["problems"], r["dcgm_version"], len(r["device_ids"])) == ([], "3.3.8", 8)
    memory = by_name(r)["GPU Memory"]
    assert memory["status"] == "fail" and memory["results"][0]["raw_status"] == "Fail - All"
    assert len(memory["warnings"]) == 8
    assert memory["warnings"][7] == {
        "message": "GPU 7 Error using CUDA API cuInit Check DCGM and system logs for errors. Reset GPU. Restart"
        " DCGM. Rerun diagnostics. Unable to initialize CUDA library: 'system not yet initialized'. . Please"
        " check if a CUDA sample program can be run successfully on this host. Refer to"
        " https://github.com/nvidia/cuda-samples",
        "error_id": None,
    }
    # DCGM truncated its own info text of Persistence Mode ("Enable pers"): kept as printed.
    assert by_name(r)["Persistence Mode"]["info"][0].endswith("Persistence mode for GPU 4 is disabled. Enable pers")


def test_v4_table_per_gpu_rows():
    r = parsed(V442_PASS)
    assert (r["problems"], r["dcgm_version"], r["driver_version"]) == ([], "4.4.2", "580.105.08")
    assert [(t["name"], t["status"], t["summary_status"], [x["entity"] for x in t["results"]]) for t in r["tests"]] == [
        ("software", "pass", "pass", ["GPU0"]),
        ("memory", "pass", "pass", ["GPU0"]),
        ("pcie", "pass", "pass", ["GPU0"]),
    ]


def test_v4_test_row_fail_with_every_gpu_passing_fails_the_test():
    r = parsed(B200_PCIE)
    assert r["problems"] == []
    pcie = by_name(r)["pcie"]
    assert (pcie["status"], pcie["summary_status"]) == ("fail", "fail")
    assert [(x["gpus"], x["status"]) for x in pcie["results"]] == [([g], "pass") for g in range(8)]
    assert pcie["warnings"] == [
        {
            "message": "There was an internal error during the test: 'Output of child process (11167) couldn't be"
            " parsed: '* Line 1, Column 1 Syntax error: value, object or array expected. '' Check DCGM and system"
            " logs for errors. Reset GPU. Restart DCGM. Rerun diagnostics.",
            "error_id": None,
        }
    ]


def test_table_without_its_closing_border_is_a_problem():
    # The 4.2.3 paste ends after the last GPU row of pcie.
    r = parsed(V423_PCIE)
    assert r["problems"] == ["the table has no closing border (the output was cut short)"]
    assert r["other_lines"] == [
        "Executing in Pod nvidia-dcgm-rz9cr on Host 10.0.7.139",
        "Successfully ran diagnostic for group.",
    ]
    assert len(by_name(r)["pcie"]["warnings"]) == 4


def test_v3_partial_gpu_results_and_a_fragment():
    r = parsed(THERMAL_FRAGMENT)
    memory = by_name(r)["GPU Memory"]
    assert [(x["gpus"], x["status"]) for x in memory["results"]] == [([1, 2, 3, 4, 5, 6, 7], "pass"), ([0], "fail")]
    assert memory["status"] == "fail"
    # The paste stops mid-cell ("| ts.", no closing bar): that line is not a table row.
    assert r["problems"] == [
        "line 1: test 'GPU Memory' comes before any category row",
        "line 8 is not a table row: '|                           | ts.' (truncated or mangled output)",
        "the output has no '| Diagnostic | Result |' header row (a fragment, not a whole table)",
        "the table has no closing border (the output was cut short)",
    ]


def test_unknown_status_word_in_a_table_is_a_problem():
    # Derived from the 4.4.2 pass: the memory row's "Pass" replaced by a word DCGM does not print.
    text = sample(V442_PASS).replace(
        "| memory                    | Pass      ", "| memory                    | Maybe     "
    )
    r = dcgm.parse_output(text)
    assert r["problems"] == ["line 13: memory: unknown result 'Maybe'"]
    result = judge_mod.judge(r)
    assert result["passed"] is False
    assert checks_of(result)["dcgm_output"]["reason"] == "line 13: memory: unknown result 'Maybe'"


# == JSON =====================================================================================
def test_v3_json_with_nulls_and_a_banner():
    r = parsed(NVVS_310)
    assert (r["format"], r["problems"], r["dcgm_version"]) == ("json", [], "3.1.0")
    assert r["other_lines"] == ["WARNING: THIS SHOULD NOT HAPPEN"]
    assert [t["name"] for t in r["tests"]][:2] == ["Denylist", "NVML Library"]
    assert len(r["tests"]) == 10
    assert by_name(r)["Denylist"]["results"][0]["gpus"] == list(range(8))
    assert [x["gpus"] for x in by_name(r)["software"]["results"]] == [[g] for g in range(8)]
    assert all(t["status"] == "pass" for t in r["tests"])


def test_v4_json_is_read_by_its_keys():
    r = parsed(GB10_JSON)
    assert (r["format"], r["problems"], r["dcgm_version"], r["driver_version"], r["device_ids"]) == (
        "json",
        [],
        "4.2.3",
        "580.82.09",
        ["2e12"],
    )
    software = by_name(r)["software"]
    assert (software["category"], software["status"], software["summary_status"]) == ("Deployment", "fail", "fail")
    assert software["results"] == [
        {
            "entity": "GPU0",
            "gpus": [0],
            "status": "fail",
            "raw_status": "Fail",
            "warnings": [
                {
                    "message": "Persistence Mode: Persistence mode for GPU 0 is disabled. Enable persistence mode by"
                    ' running "nvidia-smi -i <gpuId> -pm 1 " as root.',
                    "error_id": 29,
                }
            ],
            "info": [],
        }
    ]
    assert software["info"] == [
        "Error getting the SRAM Threshold Count for GPU 0. Status = 0. Value = 9223372036854775794. SRAM Threshold"
        " checking was skipped."
    ]


def test_a_test_object_alone_is_not_a_document():
    # NVIDIA/DCGM issue 215's paste is one test of a 4.x document, ending in a comma.
    r = parsed(V4_FRAGMENT)
    assert r["tests"] == []
    assert r["problems"] == [
        'the JSON document has no "DCGM Diagnostic" (4.x) or "DCGM GPU Diagnostic" (2.x/3.x) object; its keys:'
        " name, results, test_summary"
    ]
    assert r["other_lines"] == [","]


def test_v4_test_object_of_issue_215_reads_inside_a_document():
    # Derived: that issue's test object wrapped in the 4.x document shape its schema gives.
    item = json.loads(sample(V4_FRAGMENT).strip().rstrip(","))
    doc = {"DCGM Diagnostic": {"test_categories": [{"category": "Hardware", "tests": [item]}]}}
    r = dcgm.parse_output(json.dumps(doc))
    diag = by_name(r)["diagnostic"]
    assert (r["problems"], diag["status"], len(diag["results"])) == ([], "pass", 8)
    assert diag["results"][0]["info"][2] == "GPU 0 calculated at approximately 859.08 gigaflops during this test"
    assert diag["results"][3]["info"] == []


def test_truncated_json_is_a_problem():
    # Derived: the GB10 document cut in the middle of its entity list.
    text = sample(GB10_JSON)
    r = dcgm.parse_output(text[: text.index('"entity_groups"')])
    assert r["tests"] == []
    assert r["problems"][0].startswith("the JSON document does not decode: ")
    assert r["problems"][0].endswith("(truncated or mangled output)")


def test_unknown_json_status_is_a_problem_and_fails():
    # Derived: the GB10 document with its result status replaced.
    text = sample(GB10_JSON).replace('"status" : "Fail",', '"status" : "Inconclusive",')
    r = dcgm.parse_output(text)
    assert r["problems"] == ["software: unknown status 'Inconclusive'"]
    result = judge_mod.judge(r)
    assert result["passed"] is False and checks_of(result)["dcgm_output"]["status"] == "fail"


def test_engine_down_is_named():
    r = parsed(ENGINE_DOWN)
    assert r["engine_down"] == (
        "Error: unable to establish a connection to the specified host: localhost Error: Unable to connect to host"
        " engine. Host engine connection invalid/disconnected."
    )
    result = judge_mod.judge(r, rc=255)
    assert result["passed"] is False and [c["name"] for c in result["checks"]] == ["dcgm_output"]
    check = result["checks"][0]
    assert check["action"] == _verdict.CONFIGURE
    assert check["reason"].endswith(
        ": start the DCGM host engine (systemctl start nvidia-dcgm, or nv-hostengine) and run again"
    )


def test_empty_output_is_a_problem():
    r = dcgm.parse_output("")
    assert r["problems"] == ["the output holds neither a JSON document nor a result table (no output)"]
    assert judge_mod.judge(r, rc=0)["passed"] is False


# == the judgement ============================================================================
def test_healthy_v100_passes_with_the_skip_as_a_warning():
    result = judge_mod.judge(parsed(V100_R3))
    assert (result["passed"], result["status"], result["dcgm_version"]) == (True, "warn", "3.3.9")
    checks = checks_of(result)
    assert len(checks) == 17
    assert checks["dcgm:PCIe"] == {
        "name": "dcgm:PCIe",
        "status": "pass",
        "gpus": [],
        "reason": "DCGM passed it",
        "action": "none",
    }
    assert checks["dcgm:EUD Test"] == {
        "name": "dcgm:EUD Test",
        "status": "warn",
        "gpus": [],
        "reason": "DCGM skipped it: DCGM gave no reason",
        "action": _verdict.CONFIGURE,
    }
    assert (
        result["reason"]
        == "every DCGM test passed or warned; warnings: dcgm:EUD Test: DCGM skipped it: DCGM gave no reason"
    )


def test_cuda_not_initialized_fails_memory_and_names_every_gpu():
    result = judge_mod.judge(parsed(H100_CUDA))
    memory = checks_of(result)["dcgm:GPU Memory"]
    assert (result["passed"], memory["status"], memory["gpus"]) == (False, "fail", list(range(8)))
    # 'system not yet initialized' is the fabric manager missing: configuration, not hardware.
    assert memory["action"] == _verdict.CONFIGURE
    assert memory["reason"].startswith("GPU 0 Error using CUDA API cuInit Check DCGM and system logs")
    assert checks_of(result)["dcgm:PCIe"]["status"] == "warn"
    assert [c["name"] for c in result["checks"] if c["status"] == "fail"] == ["dcgm:GPU Memory"]


def test_persistence_mode_failure_calls_for_configuration():
    result = judge_mod.judge(parsed(RTX_PERSISTENCE))
    check = checks_of(result)["dcgm:Persistence Mode"]
    assert (result["passed"], check["status"], check["action"]) == (False, "fail", _verdict.CONFIGURE)
    assert check["reason"].startswith("Persistence mode for GPU 0 is currently disabled.")
    assert checks_of(result)["dcgm:Memtest"]["status"] == "pass"


def test_v4_json_failure_carries_the_dcgm_error_id():
    result = judge_mod.judge(parsed(GB10_JSON))
    check = checks_of(result)["dcgm:software"]
    assert check == {
        "name": "dcgm:software",
        "status": "fail",
        "gpus": [0],
        "reason": "Persistence Mode: Persistence mode for GPU 0 is disabled. Enable persistence mode by running"
        ' "nvidia-smi -i <gpuId> -pm 1 " as root. (DCGM error 29)',
        "action": _verdict.CONFIGURE,
    }
    assert (result["dcgm_version"], result["driver_version"], result["format"]) == ("4.2.3", "580.82.09", "json")


def test_v4_internal_error_fails_the_test_without_naming_a_gpu():
    check = checks_of(judge_mod.judge(parsed(B200_PCIE)))["dcgm:pcie"]
    assert (check["status"], check["gpus"], check["action"]) == ("fail", [], _verdict.CONFIGURE)
    assert check["reason"].endswith("Rerun diagnostics. (DCGM failed the test while passing every GPU in it)")


def test_thermal_failure_is_inspected_on_gpu_0():
    check = checks_of(judge_mod.judge(parsed(THERMAL_FRAGMENT)))["dcgm:GPU Memory"]
    assert (check["status"], check["gpus"], check["action"]) == ("fail", [0], _verdict.INSPECT)


def test_pending_row_remaps_call_for_a_reset():
    result = judge_mod.judge(parsed(REMAP_FRAGMENT))
    check = checks_of(result)["dcgm:Deployment"]
    assert check == {
        "name": "dcgm:Deployment",
        "status": "fail",
        "gpus": [3],
        "reason": "GPU 3 has uncorrectable memory errors and row remappings are pending",
        "action": _verdict.RESET_GPU,
    }


def test_skips_warn_on_the_gpu_they_name():
    result = judge_mod.judge(parsed(GB10_SKIP))
    assert (result["passed"], result["status"]) == (True, "warn")
    warned = [(c["name"], c["gpus"]) for c in result["checks"] if c["status"] == "warn"]
    assert warned == [
        ("dcgm:memory", [0]),
        ("dcgm:diagnostic", [0]),
        ("dcgm:nvbandwidth", [0]),
        ("dcgm:pcie", [0]),
        ("dcgm:memory_bandwidth", [0]),
        ("dcgm:targeted_stress", [0]),
        ("dcgm:targeted_power", [0]),
    ]


def test_results_for_other_gpus_fail_the_run():
    result = judge_mod.judge(parsed(V442_PASS), gpus=[1])
    assert result["passed"] is False
    assert checks_of(result)["dcgm_output"]["reason"] == (
        "DCGM reported GPUs 0 where the run asked for 1 (results from another GPU set)"
    )
    assert judge_mod.judge(parsed(V442_PASS), gpus=[0])["passed"] is True


def test_non_zero_exit_without_a_failed_test_fails():
    result = judge_mod.judge(parsed(V442_PASS), rc=226)
    assert result["passed"] is False
    assert checks_of(result)["dcgm_output"]["reason"] == "dcgmi exited 226 although no test failed"
    # With a failed test the exit status is DCGM's way of saying so: no extra problem.
    failed = judge_mod.judge(parsed(GB10_JSON), rc=226)
    assert checks_of(failed)["dcgm_output"]["status"] == "pass"


def test_timeout_fails_without_judging_the_tests():
    result = judge_mod.judge(parsed(V442_PASS), timed_out=True, timeout=5, argv=["dcgmi", "diag", "-r", "2", "-j"])
    assert [c["name"] for c in result["checks"]] == ["dcgm_output"]
    assert result["checks"][0]["reason"] == (
        "`dcgmi diag -r 2 -j` did not finish within 5 s; its process group was killed: a diagnostic that hangs is a"
        " GPU to inspect"
    )


# == the module ===============================================================================
def fake_dcgmi(tmp_path, run_sample, rc=0, sleep=0):
    """A script that appends its argv (one per line, then ``--``) to ``argv.log`` and prints
    ``run_sample``, then exits ``rc``."""
    script = tmp_path / "dcgmi"
    record = tmp_path / "argv.log"
    script.write_text(
        "#!/bin/sh\nprintf '%%s\\n' \"$@\" >> '%s'\necho -- >> '%s'\n%scat '%s'\nexit %d\n"
        % (record, record, "sleep %d\n" % sleep if sleep else "", DATA / run_sample, rc)
    )
    script.chmod(0o755)
    return script, record


def calls(record):
    return [chunk.strip("\n").split("\n") for chunk in record.read_text().split("--\n") if chunk.strip()]


def test_module_passes_a_healthy_run(tmp_path):
    binary, record = fake_dcgmi(tmp_path, V442_PASS)
    result = run_module("dcgm_diag", {"binary": str(binary), "level": 2, "gpus": [0]})
    assert not result.get("failed"), result.get("msg")
    assert calls(record) == [["diag", "-r", "2", "-j", "-i", "0"]]
    assert result["cmd"] == [str(binary), "diag", "-r", "2", "-j", "-i", "0"]
    assert (result["changed"], result["available"], result["passed"], result["status"]) == (False, True, True, "pass")
    assert (result["level"], result["dcgm_version"], result["format"], result["rc"]) == (2, "4.4.2", "text", 0)
    assert [c["name"] for c in result["checks"]] == ["dcgm_output", "dcgm:software", "dcgm:memory", "dcgm:pcie"]
    assert "stdout" not in result


def test_module_fails_a_failed_test_with_the_full_result(tmp_path):
    binary, record = fake_dcgmi(tmp_path, GB10_JSON, rc=226)
    result = run_module("dcgm_diag", {"binary": str(binary), "parameters": {"software.test_persistence_mode": False}})
    assert calls(record) == [["diag", "-r", "1", "-j", "-p", "software.test_persistence_mode=false"]]
    assert result["failed"] is True and result["rc"] == 226
    assert result["msg"].startswith(
        "DCGM diagnostic (level 1) judged the node unhealthy on `%s diag -r 1 -j -p software.test_persistence_mode=false`:"
        " dcgm:software: Persistence Mode: Persistence mode for GPU 0 is disabled." % binary
    )
    assert (result["status"], result["dcgm_version"], result["format"]) == ("fail", "4.2.3", "json")
    assert result["tests"][0]["results"][0]["warnings"][0]["error_id"] == 29
    assert result["stdout"].startswith('{\n\t"DCGM Diagnostic" :')


def test_module_engine_down(tmp_path):
    binary, _record = fake_dcgmi(tmp_path, ENGINE_DOWN, rc=255)
    result = run_module("dcgm_diag", {"binary": str(binary)})
    assert result["failed"] is True
    assert "dcgmi cannot reach the DCGM host engine" in result["msg"]
    assert "systemctl start nvidia-dcgm, or nv-hostengine" in result["msg"]


def test_module_timeout_kills_the_run(tmp_path):
    binary, record = fake_dcgmi(tmp_path, V442_PASS, sleep=60)
    started = time.monotonic()
    result = run_module("dcgm_diag", {"binary": str(binary), "timeout": 2})
    assert time.monotonic() - started < 30
    assert result["failed"] is True and "rc" not in result
    assert "`%s diag -r 1 -j` did not finish within 2 s; its process group was killed" % binary in result["msg"]
    assert calls(record) == [["diag", "-r", "1", "-j"]]


def test_module_check_mode_runs_nothing(tmp_path):
    binary, record = fake_dcgmi(tmp_path, V442_PASS)
    result = run_module("dcgm_diag", {"binary": str(binary), "level": 3, "gpus": [0, 1]}, check_mode=True)
    assert not result.get("failed"), result.get("msg")
    assert not record.exists()
    assert (result["status"], result["passed"], result["changed"], result["tests"]) == ("not_run", None, False, [])
    assert result["cmd"] == [str(binary), "diag", "-r", "3", "-j", "-i", "0,1"]
    assert result["reason"].startswith("check mode: dcgmi diag was not run")


def test_module_without_dcgmi(tmp_path):
    absent = run_module("dcgm_diag", {"binary": str(tmp_path / "dcgmi")})
    assert not absent.get("failed")
    assert (absent["available"], absent["passed"], absent["status"], absent["cmd"]) == (
        False,
        False,
        "unavailable",
        None,
    )
    assert absent["reason"] == "%s is not an executable file" % (tmp_path / "dcgmi")
    named = run_module("dcgm_diag", {"binary": "dcgmi-not-installed"}, check_mode=True)
    assert (named["available"], named["passed"]) == (False, False)
    assert named["reason"].startswith("dcgmi-not-installed is not installed (not on PATH, /usr/bin, /usr/local/bin)")


def test_module_refuses_unsafe_parameters(tmp_path):
    binary, record = fake_dcgmi(tmp_path, V442_PASS)
    result = run_module("dcgm_diag", {"binary": str(binary), "parameters": {"memtest.test0": "1;rm -rf /"}})
    assert result["failed"] is True and result["msg"].startswith("parameters['memtest.test0'] = '1;rm -rf /'")
    assert not record.exists()
