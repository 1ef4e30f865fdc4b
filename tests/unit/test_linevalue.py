# -*- coding: utf-8 -*-
# SPDX-License-Identifier: GPL-3.0-or-later
"""The one check of values written into env files and systemd unit lines: the rules,
the filters every template applies, the runtime env derivation using the same function, and a
scan proving that no role template writes an env-file or unit value without it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.gpufleet.node.plugins.filter import line_values
from ansible_collections.gpufleet.node.plugins.module_utils.common import _linevalue
from ansible_collections.gpufleet.node.plugins.module_utils.nccl import _env

REPO = Path(__file__).resolve().parents[2]
SECRET = "hf_abcdef0123456789"


@pytest.mark.parametrize(
    "value", [SECRET + "\nLD_PRELOAD=/tmp/evil.so", SECRET + "\r\nX=1", "a\x00b", "a\x1bb", "a\u2028b", "a\tb"]
)
def test_env_value_newline_injection_refused(value):
    with pytest.raises(_linevalue.LineValueError, match="^vllm_server_hf_token contains .* would add a line") as err:
        _linevalue.env_value(value, "vllm_server_hf_token")
    assert SECRET not in str(err.value) and "LD_PRELOAD" not in str(err.value)  # a secret is never echoed


@pytest.mark.parametrize("value", ['"quoted"', "back\\slash", " padded", "it's"])
def test_env_values_systemd_and_docker_read_differently_are_refused(value):
    with pytest.raises(_linevalue.LineValueError, match="read by both systemd and docker"):
        _linevalue.env_value(value, "X")


@pytest.mark.parametrize(
    "value", ["Llama\nExecStartPre=/bin/sh -c 'id > /tmp/pwned'", "/var/cache/hf\r", "/opt/vllm\\"]
)
def test_unit_value_newline_injection_refused(value):
    with pytest.raises(_linevalue.LineValueError, match="^served_model_name (contains|ends with)"):
        _linevalue.unit_value(value, "served_model_name")


def test_good_values_pass_unchanged_as_text():
    assert _linevalue.unit_value("/var/cache/hugging face", "x") == "/var/cache/hugging face"
    assert _linevalue.env_value("expandable_segments:True", "X") == "expandable_segments:True"
    assert _linevalue.unit_value(30, "x") == "30" and _linevalue.env_value(True, "X") == "true"
    assert _linevalue.line_value("a\\", "x") == "a\\"  # only units join lines on a trailing backslash


def test_env_names():
    assert _linevalue.env_name("NCCL_P2P_LEVEL") == "NCCL_P2P_LEVEL"
    for bad in ("BAD NAME", "1X", "A=B", "X\nY"):
        with pytest.raises(_linevalue.LineValueError, match="not an environment variable name"):
            _linevalue.env_name(bad)


def test_filters_fail_the_task_naming_the_variable():
    table = line_values.FilterModule().filters()
    assert set(table) == {"line_value", "unit_value", "env_value", "env_name"}
    with pytest.raises(AnsibleFilterError, match="^env_value: vllm_server_hf_token contains a newline"):
        table["env_value"]("t\nLD_PRELOAD=x", "vllm_server_hf_token")
    with pytest.raises(AnsibleFilterError, match="^unit_value: vllm_server_hf_cache contains a newline"):
        table["unit_value"]("/x\nExecStartPre=/bin/true", "vllm_server_hf_cache")
    assert table["unit_value"]("/var/cache/huggingface", "vllm_server_hf_cache") == "/var/cache/huggingface"


def test_the_runtime_env_uses_the_same_check():
    """gpu_runtime_env refuses in Python what the templates refuse: the same function, same words."""
    with pytest.raises(_env.EnvError) as err:
        _env.runtime_env({}, user_env={"OMP_NUM_THREADS": "8\nLD_PRELOAD=/tmp/evil.so"})
    with pytest.raises(_linevalue.LineValueError) as same:
        _linevalue.env_value("8\nLD_PRELOAD=/tmp/evil.so", "OMP_NUM_THREADS")
    assert str(err.value) == str(same.value)


# --- every template that writes an env file or a unit line applies the check --------------------

CHECKS = re.compile(r"gpufleet\.node\.(?:unit_value|env_value|env_name|line_value)")
EXPR = re.compile(r"\{\{(.*?)\}\}", re.S)


def _writes_lines(path):
    """Templates of env files and systemd units (units, drop-ins, sockets, timers)."""
    name = path.name
    return name.endswith(".env.j2") or "/systemd/" in path.as_posix()


def _exempt(expr):
    expr = expr.strip()
    if expr.startswith("ansible_managed"):
        return True
    # a number cannot carry a line: the last filter makes it an int or a float
    return re.match(r"^\s*(?:int|float)\b", expr.rsplit("|", 1)[-1]) is not None and "|" in expr


def unchecked(path):
    return [e.strip() for e in EXPR.findall(path.read_text()) if not CHECKS.search(e) and not _exempt(e)]


def test_no_env_or_unit_template_writes_a_value_without_the_shared_check():
    templates = [p for p in sorted((REPO / "roles").glob("*/templates/**/*.j2")) if _writes_lines(p)]
    assert len(templates) >= 10, templates  # the scan found the units and env files
    missing = {str(p.relative_to(REPO)): unchecked(p) for p in templates}
    assert {k: v for k, v in missing.items() if v} == {}


def test_the_template_scan_can_fail(tmp_path):
    bad = tmp_path / "x.service.j2"
    bad.write_text(
        "{{ ansible_managed | comment }}\nExecStart={{ my_bin }} --t {{ t | int + 5 }}\n"
        "User={{ u | gpufleet.node.unit_value('u') }}\n"
    )
    assert unchecked(bad) == ["my_bin"]
