# SPDX-License-Identifier: GPL-3.0-or-later
"""gpufleet.node.agent_files (plugins/filter/agent_files.py): the collection's code each node-side
agent imports, found from the imports themselves, as the entries its role writes."""

from __future__ import annotations

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.gpufleet.node.plugins.filter.agent_files import COLLECTION, agent_files
from tests.harness import REPO

LIB = "/usr/local/lib/gpufleet"
TREE = "ansible_collections/gpufleet/node/plugins/module_utils"
#: The packages above the collection's module_utils: empty __init__.py files of their own.
ABOVE = [
    "ansible_collections/__init__.py",
    "ansible_collections/gpufleet/__init__.py",
    "ansible_collections/gpufleet/node/__init__.py",
    "ansible_collections/gpufleet/node/plugins/__init__.py",
]


def installed(agent, lib=LIB):
    """``{path under lib: 'file' or 'content'}`` of the entries for ``agent``."""
    entries = agent_files(str(agent), lib)
    assert [e["dest"] for e in entries] == sorted(e["dest"] for e in entries)
    return {e["dest"][len(lib) + 1 :]: ("file" if "file" in e else "content") for e in entries}


def tree(*names):
    return [f"{TREE}/{name}" for name in names]


@pytest.mark.parametrize(
    "agent,expected",
    [
        (
            "roles/gpu_health/files/gpufleet_gpu_health_watch.py",
            tree(
                "__init__.py",
                "common/__init__.py",
                "common/_atomic.py",
                "common/_proc.py",
                "common/_textfile.py",
                "gpu/__init__.py",
                "gpu/_nvsmi.py",
                "gpu/_nvsmi_q.py",
                "health/__init__.py",
                "health/_checks.py",
                "health/_history.py",
                "health/_kernel_log.py",
                "health/_thresholds.py",
                "health/_verdict.py",
                "nccl/__init__.py",
                "nccl/_readiness.py",
                "pcie/__init__.py",
                "pcie/_path.py",
                "serving/__init__.py",
                "serving/_probe_record.py",
            ),
        ),
        (
            "roles/lb_registration/files/gpufleet_lb_agent.py",
            tree(
                "__init__.py",
                "lb/__init__.py",
                "lb/_allow.py",
                "nccl/__init__.py",
                "nccl/_readiness.py",
                "serving/__init__.py",
                "serving/_probe_record.py",
            ),
        ),
        (
            "roles/lb_registration/files/gpufleet_serving_probe.py",
            tree(
                "__init__.py",
                "common/__init__.py",
                "common/_atomic.py",
                "common/_http.py",
                "common/_textfile.py",
                "nccl/__init__.py",
                "nccl/_readiness.py",
                "serving/__init__.py",
                "serving/_probe.py",
                "serving/_probe_record.py",
            ),
        ),
        (
            "roles/worker_recycle/files/gpufleet_worker_recycle.py",
            tree(
                "__init__.py",
                "common/__init__.py",
                "common/_atomic.py",
                "common/_http.py",
                "common/_textfile.py",
                "lb/__init__.py",
                "lb/_budget.py",
                "lb/_haproxy.py",
                "serving/__init__.py",
                "serving/_recycle.py",
                "serving/_vllm_metrics.py",
            ),
        ),
    ],
)
def test_each_agent_gets_what_it_imports_and_the_packages_above(agent, expected):
    files = installed(REPO / agent)
    assert sorted(files) == sorted(ABOVE + expected)
    assert {name for name, kind in files.items() if kind == "content"} == set(ABOVE)


def test_sources_are_the_collection_files_and_inits_are_empty():
    for entry in agent_files(str(REPO / "roles/lb_registration/files/gpufleet_lb_agent.py"), LIB):
        if "file" in entry:
            assert entry["file"].startswith(COLLECTION + "/plugins/module_utils/")
            assert entry["dest"] == f"{LIB}/ansible_collections/gpufleet/node/{entry['file'][len(COLLECTION) + 1 :]}"
        else:
            assert entry["content"] == "" and entry["dest"].endswith("/__init__.py")


def test_imports_in_function_bodies_and_through_other_files_count(tmp_path):
    agent = tmp_path / "agent.py"
    agent.write_text(
        "def main():\n    from ansible_collections.gpufleet.node.plugins.module_utils.nccl._readiness import agent_verdict\n"
    )
    assert tree("nccl/_readiness.py")[0] in installed(agent)
    # _backend imports _kvplan, _llamaplan (which imports _gguf inside a function) and _vllm ...
    agent.write_text("import ansible_collections.gpufleet.node.plugins.module_utils.serving._backend\n")
    files = installed(agent)
    for name in ("_backend.py", "_kvplan.py", "_llamaplan.py", "_gguf.py", "_model_profiles.py", "_vllm.py"):
        assert f"{TREE}/serving/{name}" in files


def test_an_import_the_collection_does_not_have_fails(tmp_path):
    agent = tmp_path / "agent.py"
    agent.write_text("from ansible_collections.gpufleet.node.plugins.module_utils import _nonexistent\n")
    with pytest.raises(AnsibleFilterError, match="imports .*module_utils._nonexistent, which is not in the collection"):
        agent_files(str(agent), LIB)
    agent.write_text("import json\n")
    assert agent_files(str(agent), LIB) == []
    with pytest.raises(AnsibleFilterError, match="absolute path"):
        agent_files(str(agent), "usr/local/lib")
    with pytest.raises(AnsibleFilterError, match="cannot read the imports"):
        agent_files(str(tmp_path / "missing.py"), LIB)
