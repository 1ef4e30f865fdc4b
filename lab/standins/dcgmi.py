# SPDX-License-Identifier: GPL-3.0-or-later
"""DCGM's `dcgmi diag` for a lab machine: DCGM 3.3's tests by level, in its JSON (`-j`) or its
text table, each result answered from the hardware model and the machine's health state NOW.

The machine is the one `lab.hwmodel.build()` laid out under $GPUFLEET_LAB_ROOT. The tests and
their categories are DCGM 3.3.9's as its own `dcgmi diag -r 3` and `-r 4` print them (samples in
tests/data/dcgm): level 1 the Deployment tests, level 2 adds PCIe (Integration) and GPU Memory
(Hardware), level 3 Diagnostic (Hardware) and the Stress tests, with EUD Test skipped (no EUD
package on the machine), level 4 Pulse Test and Memtest. The JSON is 3.x's shape
(`"DCGM GPU Diagnostic"` -> `test_categories` -> `tests` -> `results` per `gpu_ids`, warnings as
`{"warning", "error_id", "error_category", "error_severity"}`), the messages DCGM's own format
strings (dcgmlib/dcgm_errors.h: `DCGM_FR_FAULTY_MEMORY_MSG`, `DCGM_FR_LOW_BANDWIDTH_MSG`,
`DCGM_FR_PCIE_WIDTH_MSG`, `DCGM_FR_PCIE_GENERATION_MSG`).

What fails, from the model:

* GPU Memory (level 2 and up) and Memtest (level 4): `lab fault NODE dcgm-memory --gpu N`
  (faulty memory elements on GPU N);
* PCIe (level 2 and up): `lab fault NODE dcgm-pcie --gpu N` (host<->device bandwidth under
  DCGM's minimum), and a GPU whose link trained below its design width or generation right now
  (`link-degrade`: DCGM's `min_pci_width` check);
* Page Retirement/Row Remap (level 1 and up): a pending row remap or a remap failure
  (`remap-pending`), in the words of a real faulty node's output;
* no answer at all when the driver is not usable (`driver-not-loaded`, `library-mismatch`,
  `no-devices`): DCGM's host engine cannot run, and dcgmi prints what it prints when it cannot
  reach one (exit non-zero).

Only GPUs bound to the `nvidia` driver and not lost exist, as for NVML. `-i` names GPU indices;
one that does not exist fails as dcgmi does, before any test. The lab's own choices (the
bandwidth figures DCGM would print, the faulty element count, the exit statuses) are marked as
such; they are not the collection's model (plugins/module_utils/diag/): the stand-in must not
share the bugs of what it tests.
"""

from __future__ import annotations

import argparse
import json
import sys

from lab.hwmodel import Node
from lab.hwmodel.profiles import GPU_MODELS

VERSION = "3.3.9"
#: The exit status of a run with a failed test and of one that reached no host engine: the lab's
#: choice (non-zero, as dcgmi's are), not figures read from DCGM.
EXIT_FAILED, EXIT_NO_ENGINE = 1, 255

#: (category, test, first level) in the order DCGM 3.3.9 prints them.
TESTS = (
    ("Deployment", "Denylist", 1),
    ("Deployment", "NVML Library", 1),
    ("Deployment", "CUDA Main Library", 1),
    ("Deployment", "Permissions and OS Blocks", 1),
    ("Deployment", "Persistence Mode", 1),
    ("Deployment", "Environment Variables", 1),
    ("Deployment", "Page Retirement/Row Remap", 1),
    ("Deployment", "Graphics Processes", 1),
    ("Deployment", "Inforom", 1),
    ("Integration", "PCIe", 2),
    ("Hardware", "GPU Memory", 2),
    ("Hardware", "Diagnostic", 3),
    ("Hardware", "Pulse Test", 4),
    ("Stress", "Targeted Stress", 3),
    ("Stress", "Targeted Power", 3),
    ("Stress", "Memory Bandwidth", 3),
    ("Stress", "EUD Test", 3),
    ("Stress", "Memtest", 4),
)
#: Tests that run per GPU (their text rows read `Pass - All`); the Deployment tests report once.
PER_GPU_CATEGORIES = ("Integration", "Hardware", "Stress")
#: A test the machine cannot run: skipped, as a node without NVIDIA's EUD package skips it.
SKIPPED = {"EUD Test"}

# dcgm_errors.h: (error_id, category, severity) of the messages the stand-in prints.
FAULTY_MEMORY = (52, 10, 2)  # DCGM_FR_FAULTY_MEMORY, hardware memory, isolate
LOW_BANDWIDTH = (30, 13, 4)  # DCGM_FR_LOW_BANDWIDTH, hardware PCIe, triage
PCIE_WIDTH = (46, 13, 4)  # DCGM_FR_PCIE_WIDTH
PCIE_GENERATION = (45, 13, 4)  # DCGM_FR_PCIE_GENERATION
PENDING_ROW_REMAP = (85, 10, 6)  # DCGM_FR_PENDING_ROW_REMAP, hardware memory, reset

#: The lab's own figures for a `dcgm-pcie` fault (GB/s, as DCGM's pcie plugin prints them).
SLOW_H2D_GBPS, MIN_H2D_GBPS = 4.21, 20.0
FAULTY_ELEMENTS = 4

ENGINE_DOWN = (
    "Error: unable to establish a connection to the specified host: localhost\n"
    "Error: Unable to connect to host engine. Host engine connection invalid/disconnected.\n"
)


def arg_parser():
    p = argparse.ArgumentParser(prog="dcgmi diag", add_help=True)
    p.add_argument("-r", "--run", required=True)
    p.add_argument("-i", "--gpuList", "--entity-id", dest="gpus", default=None)
    p.add_argument("-p", "--parameters", default=None)
    p.add_argument("-j", "--json", action="store_true")
    p.add_argument("-v", "--verbose", action="store_true")
    return p


def level_of(run):
    names = {"short": 1, "quick": 1, "medium": 2, "long": 3, "xlong": 4}
    if run in names:
        return names[run]
    if run in ("1", "2", "3", "4"):
        return int(run)
    return None


def device_id(gpu):
    """The PCI device id DCGM prints for a GPU (``2330`` for an H100 SXM)."""
    return "%04x" % next(m["device_id"] for m in GPU_MODELS.values() if m["name"] == gpu.name)


def gpus_of(node, state):
    """Model indices of the GPUs CUDA and NVML see now."""
    return [g.index for g in node.gpus if g.driver == "nvidia" and not node.gpu_lost(g.index, state)]


def failures(node, test, i, state):
    """``[(message, (error_id, category, severity))]`` of ``test`` on GPU ``i`` now."""
    g = node.gpus[i]
    health = node.gpu_health(i, state)
    found = []
    if test == "Page Retirement/Row Remap":
        rows = health["remapped_rows"]
        if rows["pending"] or rows["failure"]:
            found.append(
                ("GPU %d has uncorrectable memory errors and row remappings are pending" % i, PENDING_ROW_REMAP)
            )
    elif test == "PCIe":
        if "pcie" in node.dcgm_faults(i, state):
            found.append(
                (
                    "Bandwidth of GPU %d in direction h2d of %.2f did not exceed minimum required bandwidth of %.2f."
                    % (i, SLOW_H2D_GBPS, MIN_H2D_GBPS),
                    LOW_BANDWIDTH,
                )
            )
        if g.width_current < g.width_max:
            found.append(
                (
                    "GPU %d is running at PCI link width %dX, which is below the minimum allowed link generation"
                    " of %d (parameter 'min_pci_width')" % (i, g.width_current, g.width_max),
                    PCIE_WIDTH,
                )
            )
        if g.gen_current < g.gen_max:
            found.append(
                (
                    "GPU %d is running at PCI link generation %d, which is below the minimum allowed link"
                    " generation of %d (parameter 'min_pci_generation')" % (i, g.gen_current, g.gen_max),
                    PCIE_GENERATION,
                )
            )
    elif test in ("GPU Memory", "Memtest") and "memory" in node.dcgm_faults(i, state):
        found.append(("Found %d faulty memory elements on GPU %d" % (FAULTY_ELEMENTS, i), FAULTY_MEMORY))
    return found


def run_tests(node, level, gpus, state):
    """``[(category, test, [(gpu, status, [(message, meta)])])]`` in DCGM's order."""
    out = []
    for category, test, first in TESTS:
        if first > level:
            continue
        results = []
        for i in gpus:
            found = failures(node, test, i, state)
            status = "Skip" if test in SKIPPED else ("Fail" if found else "Pass")
            results.append((i, status, found))
        out.append((category, test, results))
    return out


def as_json(node, gpus, tests):
    categories = {}
    for category, test, results in tests:
        if category in PER_GPU_CATEGORIES:
            rows = [_json_result(i, status, found) for i, status, found in results]
        else:
            failed = [r for r in results if r[1] == "Fail"]
            status = "Fail" if failed else results[0][1]
            row = {"gpu_ids": ",".join(str(i) for i in gpus), "status": status}
            messages = [_warning(m, meta) for _i, _s, found in failed for m, meta in found]
            if messages:
                row["warnings"] = messages
            rows = [row]
        categories.setdefault(category, []).append({"name": test, "results": rows})
    document = {
        "DCGM GPU Diagnostic": {
            "test_categories": [{"category": name, "tests": tests_} for name, tests_ in categories.items()],
            "version": VERSION,
            "Driver Version Detected": node.driver_version,
            "GPU Device IDs": [device_id(node.gpus[i]) for i in gpus],
        }
    }
    return json.dumps(document, indent=4) + "\n"


def _json_result(i, status, found):
    row = {"gpu_ids": i, "status": status}
    if found:
        row["warnings"] = [_warning(m, meta) for m, meta in found]
    return row


def _warning(message, meta):
    error_id, category, severity = meta
    return {"warning": message, "error_id": error_id, "error_category": category, "error_severity": severity}


# -- the text table (dcgmi's DcgmiOutputTree: 27 + 48 columns, messages wrapped at 45) --------------
NAME_W, VALUE_W, WRAP = 25, 46, 45


def _row(name, value):
    return "| %-*s | %-*s |" % (NAME_W, name, VALUE_W, value)


def _category(name, first):
    head = "-----  %s  " % name
    fill = "+" if not first else "|"
    return ("%s%s%s%s%s" % (fill, head, "-" * (NAME_W + 2 - len(head)), "+", "-" * (VALUE_W + 2))) + (
        "|" if first else "+"
    )


def as_text(node, gpus, tests):
    border = "+" + "-" * (NAME_W + 2) + "+" + "-" * (VALUE_W + 2) + "+"
    lines = [
        "Successfully ran diagnostic for group.",
        border,
        _row("Diagnostic", "Result"),
        border.replace("-", "="),
        _category("Metadata", True),
        _row("DCGM Version", VERSION),
        _row("Driver Version Detected", node.driver_version),
        _row("GPU Device IDs Detected", ",".join(device_id(node.gpus[i]) for i in gpus)),
    ]
    current = None
    for category, test, results in tests:
        if category != current:
            lines.append(_category(category, category == "Deployment"))
            current = category
        failed = [i for i, status, _found in results if status == "Fail"]
        if category in PER_GPU_CATEGORIES:
            status = results[0][1] if not failed else "Fail"
            who = "All" if not failed or len(failed) == len(results) else "GPU: %s" % ", ".join(map(str, failed))
            lines.append(_row(test, "%s - %s" % (status, who)))
        else:
            lines.append(_row(test, "Fail" if failed else results[0][1]))
        for _i, _status, found in results:
            for message, _meta in found:
                chunks = [message[k : k + WRAP] for k in range(0, len(message), WRAP)]
                lines.append(_row("Warning" if category in PER_GPU_CATEGORIES else "Error", chunks[0]))
                lines += [_row("", chunk) for chunk in chunks[1:]]
    lines.append(border)
    return "\n".join(lines) + "\n"


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] != "diag":
        print("dcgmi (lab): only `dcgmi diag` is modelled", file=sys.stderr)
        return 2
    args = arg_parser().parse_args(argv[1:])
    level = level_of(args.run)
    if level is None:
        print("Error: Invalid value for the run parameter: %s" % args.run, file=sys.stderr)
        return 2
    try:
        node = Node.load()
    except RuntimeError as e:
        print("dcgmi (lab): %s" % e, file=sys.stderr)
        return 2
    state = node.health
    if node.driver_fault(state):
        sys.stdout.write(ENGINE_DOWN)
        return EXIT_NO_ENGINE
    present = gpus_of(node, state)
    gpus = present
    if args.gpus is not None:
        try:
            gpus = [int(g) for g in args.gpus.split(",")]
        except ValueError:
            print("Error: Invalid GPU list: %s" % args.gpus, file=sys.stderr)
            return 2
        missing = [g for g in gpus if g not in present]
        if missing:
            print("Error: GPU %d is not a valid GPU id." % missing[0])
            return 2
    if not gpus:
        print("Error: No GPUs found on the system.")
        return 2
    tests = run_tests(node, level, gpus, state)
    sys.stdout.write(as_json(node, gpus, tests) if args.json else as_text(node, gpus, tests))
    failed = any(status == "Fail" for _c, _t, results in tests for _i, status, _f in results)
    return EXIT_FAILED if failed else 0
