# SPDX-License-Identifier: GPL-3.0-or-later
"""health/_history: the node's fatal XIDs across boots, the recurrence hold and the node-wide
(software or driver) event, on real kernel-log lines (tests/data/kernel-log, sources in its
README), and the module gpu_health_hold that clears the hold."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ansible_collections.gpufleet.node.plugins.module_utils.health import _history, _kernel_log, _verdict
from tests.harness.modules import run_module

LOG = Path(__file__).resolve().parents[1] / "data" / "kernel-log"
FALLEN = (LOG / "dmesg-fallen-off-bus.log").read_text()  # XID 79 (fallen off the bus) on 0000:b3:00.0
NVLINK = (LOG / "nvlink-xid-144-149.log").read_text()  # fatal 149 on 0000:00:00, Xid 94 on 0000:9b:00
XID_94 = [line for line in NVLINK.splitlines() if "): 94," in line][0]
GPUS = ["0000:9b:00.0", "0000:b3:00.0"]
B1, B2, B3 = "boot-1", "boot-2", "boot-3"


def xids(text):
    return _kernel_log.parse_kernel_log(text)[0]


def on(bdf, line=XID_94):
    """The real Xid 94 line, as the driver prints it for the GPU ``bdf`` (``0000:b3:00``)."""
    return line.replace("PCI:0000:9b:00", "PCI:" + bdf)


def boots(*logs, boots=_history.DEFAULT_BOOTS):
    history = _history.empty()
    for n, text in enumerate(logs, 1):
        history, _changed = _history.observe(history, "boot-%d" % n, xids(text), GPUS, now=1000.0 * n, boots=boots)
    return history


def names(checks):
    return [(c["name"], c["status"], c["action"]) for c in checks]


def test_one_boot_records_the_event_and_holds_nothing():
    history = boots(FALLEN)
    assert history["events"] == [
        {
            "boot_id": B1,
            "gpu": "0000:b3:00.0",
            "code": 79,
            "first_seen": 1000.0,
            "last_seen": 1000.0,
            "count": 1,
            "scope": "gpu",
        }
    ]
    assert history["holds"] == [] and _history.judge(history, B1) == []


def test_the_same_xid_on_the_same_gpu_in_two_boots_holds_the_node_in_every_later_boot():
    history = boots(FALLEN, FALLEN)
    assert history["holds"] == [{"gpu": "0000:b3:00.0", "code": 79, "boots": [B1, B2], "since": 2000.0}]
    for boot in (B2, B3):  # B3: a boot where the XID did not come back
        (hold,) = _history.judge(history, boot)
        assert (hold["name"], hold["status"], hold["action"], hold["gpus"]) == (
            "xid_recurrence",
            "fail",
            "hardware inspection",
            ["0000:b3:00.0"],
        )
        assert "XID 79 on 0000:b3:00.0 in 2 boots" in hold["reason"] and "clear_gpu_hold" in hold["reason"]
    verdict = _verdict.record_of_checks(B3, _history.judge(history, B3))
    assert verdict["passed"] is False and verdict["action"] == "hardware inspection"
    # a third boot with nothing new changes nothing
    assert _history.observe(history, B3, [], GPUS, now=3000.0) == (history, False)


def test_the_same_boot_read_twice_counts_once():
    history, changed = _history.observe(_history.empty(), B1, xids(FALLEN), GPUS, now=1.0)
    again, changed_again = _history.observe(history, B1, xids(FALLEN), GPUS, now=2.0)
    assert changed and not changed_again and again == history and again["holds"] == []


def test_two_boots_on_different_gpus_or_codes_hold_nothing():
    assert boots(FALLEN, on("0000:9b:00"))["holds"] == []
    assert boots(on("0000:b3:00"), FALLEN)["holds"] == []  # 94 then 79 on one GPU


def test_the_number_of_boots_is_settable():
    assert boots(FALLEN, FALLEN, boots=3)["holds"] == []
    assert [h["boots"] for h in boots(FALLEN, FALLEN, FALLEN, boots=3)["holds"]] == [[B1, B2, B3]]
    assert len(boots(FALLEN, boots=1)["holds"]) == 1


def test_the_same_xid_on_every_gpu_in_one_boot_is_a_software_or_driver_event():
    every = "\n".join([on("0000:9b:00"), on("0000:b3:00")])
    history = boots(every)
    assert {e["scope"] for e in history["events"]} == {"node"}
    (event,) = _history.judge(history, B1)
    assert (event["name"], event["status"], event["action"]) == ("xid_node_wide", "fail", _verdict.SOFTWARE_EVENT)
    assert event["reason"].startswith("XID 94 on every GPU of the node in this boot (2 GPUs): a software or driver")
    assert _history.judge(history, B2) == []  # reported for its boot only
    # node-wide boots do not count towards one GPU's hardware inspection
    assert boots(every, every)["holds"] == []
    # the verdict names the strongest action: a software event outranks the XID's reboot
    assert _verdict.strongest_action([{"action": _verdict.REBOOT}, event]) == _verdict.SOFTWARE_EVENT


def test_one_gpu_of_a_single_gpu_node_is_not_node_wide():
    history, _changed = _history.observe(_history.empty(), B1, xids(FALLEN), ["0000:b3:00.0"], now=1.0)
    assert [e["scope"] for e in history["events"]] == ["gpu"]


def test_warnings_and_unparseable_lines_are_not_recorded():
    warn_only = "[ 8120.000001] NVRM: Xid (PCI:0000:b3:00): 13, pid=4242, name=python3, Graphics Exception"
    assert boots(warn_only, warn_only)["events"] == []
    nonfatal = [line for line in NVLINK.splitlines() if "Nonfatal" in line]
    assert boots("\n".join(nonfatal))["events"] == []


def test_the_history_is_bounded():
    history = _history.empty()
    for n in range(_history.MAX_EVENTS + 10):
        history, _changed = _history.observe(history, "boot-%d" % n, xids(FALLEN), GPUS, now=float(n), boots=10**6)
    assert len(history["events"]) == _history.MAX_EVENTS
    assert history["events"][0]["boot_id"] == "boot-10"


@pytest.mark.parametrize(
    "content, problem",
    [
        ("{not json", "is not JSON"),
        ("[]", "not a JSON object"),
        ('{"version": 9, "events": [], "holds": []}', "version 9, not 1"),
        ('{"version": 1, "events": [{"gpu": 1}], "holds": []}', "its events are not records"),
        ('{"version": 1, "events": [], "holds": "no"}', "its holds are not records"),
    ],
)
def test_an_unreadable_history_fails_naming_the_file_and_what_to_do(tmp_path, content, problem):
    path = tmp_path / "gpu-xid-history.json"
    path.write_text(content)
    with pytest.raises(_history.HistoryError) as err:
        _history.load(str(path))
    assert str(path) in str(err.value) and problem in str(err.value)
    assert "clear_gpu_hold" in str(err.value)


def test_a_history_that_cannot_be_opened_fails_and_a_missing_one_is_empty(tmp_path):
    assert _history.load(str(tmp_path / "none.json")) == _history.empty()
    with pytest.raises(_history.HistoryError, match="cannot read the GPU XID history"):
        _history.load(str(tmp_path))  # a directory
    (tmp_path / "bin").write_bytes(b"\xff\xfe")
    with pytest.raises(_history.HistoryError, match="is not text"):
        _history.load(str(tmp_path / "bin"))


def test_the_file_round_trips(tmp_path):
    history = boots(FALLEN, FALLEN)
    path = tmp_path / "h.json"
    path.write_text(_history.dump(history))
    assert _history.load(str(path)) == history


def test_clear_removes_the_hold_and_the_held_gpus_events():
    history = boots(FALLEN, on("0000:9b:00") + "\n" + FALLEN)
    cleared, what = _history.clear(history, now=5000.0)
    assert what == history["holds"] and cleared["holds"] == []
    assert [(e["gpu"], e["code"]) for e in cleared["events"]] == [("0000:9b:00.0", 94)]
    assert cleared["cleared"] == [dict(history["holds"][0], cleared=5000.0)]
    assert _history.judge(cleared, B3) == []
    # one more boot with the same XID after the clear is a first boot again
    again, _changed = _history.observe(cleared, B3, xids(FALLEN), GPUS, now=6000.0)
    assert again["holds"] == []
    assert _history.clear(_history.empty()) == (_history.empty(), [])


def test_metrics():
    history = boots(FALLEN, FALLEN)
    text = _history.textfile(history, B2)
    assert 'gpufleet_gpu_health_xid_count{gpu="0000:b3:00.0",code="79",scope="boot"} 1' in text
    assert 'gpufleet_gpu_health_xid_count{gpu="0000:b3:00.0",code="79",scope="history"} 2' in text
    assert 'gpufleet_gpu_health_xid_boots{gpu="0000:b3:00.0",code="79"} 2' in text
    assert 'gpufleet_gpu_health_xid_last_seen_timestamp_seconds{gpu="0000:b3:00.0",code="79"} 2000.000' in text
    assert "\ngpufleet_gpu_health_hold 1\n" in text
    assert 'gpufleet_gpu_health_hold_xid{gpu="0000:b3:00.0",code="79"} 1' in text
    assert 'scope="boot"} 0' in _history.textfile(history, B3)  # a later boot: none this boot
    wide = _history.textfile(boots("\n".join([on("0000:9b:00"), on("0000:b3:00")])), B1)
    assert 'gpufleet_gpu_health_xid_node_wide{code="94"} 1' in wide and "\ngpufleet_gpu_health_hold 0\n" in wide
    for line in text.splitlines():  # every sample has its HELP and TYPE
        if not line.startswith("#"):
            assert "# TYPE %s gauge" % line.split("{")[0].split(" ")[0] in text


# --- the module that clears the hold -------------------------------------------------------------


def hold_module(path, check_mode=False, diff=False, **params):
    return run_module("gpu_health_hold", dict(history_path=str(path), **params), check_mode=check_mode, diff=diff)


def test_module_clears_a_hold_with_check_mode_and_diff(tmp_path):
    path = tmp_path / "gpu-xid-history.json"
    history = boots(FALLEN, FALLEN)
    path.write_text(_history.dump(history))
    queried = hold_module(path)
    assert queried["changed"] is False and queried["holds"] == history["holds"]
    check = hold_module(path, state="cleared", check_mode=True, diff=True)
    assert check["changed"] is True and check["cleared"] == history["holds"]
    assert check["diff"]["before"] == "XID 79 on 0000:b3:00.0 in 2 boots\n" and check["diff"]["after"] == ""
    assert json.loads(path.read_text()) == history  # check mode wrote nothing
    done = hold_module(path, state="cleared")
    assert done["changed"] is True and _history.load(str(path))["holds"] == []
    assert hold_module(path, state="cleared")["changed"] is False  # no hold: nothing to do


def test_module_fails_on_an_unreadable_history(tmp_path):
    path = tmp_path / "gpu-xid-history.json"
    path.write_text("{broken")
    result = hold_module(path, state="cleared")
    assert result["failed"] is True and str(path) in result["msg"] and result["cause"] == "history"
    assert path.read_text() == "{broken"
