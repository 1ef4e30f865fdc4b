# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""How the collection asks NVML (nvidia-ml-py's ``pynvml``) for a fact a GPU or driver may not have.

Plain Python, no Ansible; ``nvml`` is the imported ``pynvml`` module (or a stand-in with its names).
"""

from __future__ import annotations


def optional(nvml, name, *args):
    """``nvml.<name>(*args)``, or None where the binding lacks the function or NVML answers an
    error (NotSupported, FunctionNotFound, ...): a missing fact is not a failure of the GPU.

    For facts that are not judged (names, topology); health facts go through ``Reader``, which
    tells "not supported" from an error."""
    fn = getattr(nvml, name, None)
    if fn is None:
        return None
    try:
        return fn(*args)
    except nvml.NVMLError:
        return None


#: NVML_ERROR_* codes (nvidia-ml-py) that mean "this GPU model or driver lacks the function":
#: NOT_SUPPORTED (3) and FUNCTION_NOT_FOUND (13).
UNSUPPORTED_CODES = (3, 13)


def error_code(exc):
    """The NVML_ERROR_* code of an ``NVMLError`` (nvidia-ml-py keeps it as ``value``), else None."""
    value = getattr(exc, "value", None)
    return value if isinstance(value, int) else None


def is_unsupported(nvml, exc):
    """Whether an ``NVMLError`` means "not supported here" (NotSupported, FunctionNotFound), by
    its code or, for bindings without codes, by its class."""
    code = error_code(exc)
    if code is not None:
        return code in (
            getattr(nvml, "NVML_ERROR_NOT_SUPPORTED", UNSUPPORTED_CODES[0]),
            getattr(nvml, "NVML_ERROR_FUNCTION_NOT_FOUND", UNSUPPORTED_CODES[1]),
        )
    classes = tuple(
        cls
        for cls in (getattr(nvml, "NVMLError_NotSupported", None), getattr(nvml, "NVMLError_FunctionNotFound", None))
        if isinstance(cls, type)
    )
    return bool(classes) and isinstance(exc, classes)


class Reader:
    """Reads one GPU's health facts and keeps what could not be read: ``unsupported``
    (``[{'field', 'reason'}]``: NotSupported, FunctionNotFound, a binding without the function) and
    ``unreadable`` (``[{'field', 'error'}]``: every other NVML error - GpuIsLost, Unknown,
    NoPermission, ...), so that an error is judged, never read as "not reported"."""

    def __init__(self, nvml):
        self.nvml = nvml
        self.unreadable = []
        self.unsupported = []

    def get(self, field, name, *args):
        """``nvml.<name>(*args)``, or None with the field noted as unsupported or unreadable."""
        fn = getattr(self.nvml, name, None)
        if fn is None:
            self.unsupported.append({"field": field, "reason": "this nvidia-ml-py has no %s" % name})
            return None
        try:
            return fn(*args)
        except self.nvml.NVMLError as exc:
            self.note(field, name, exc)
            return None

    def note(self, field, name, exc):
        if is_unsupported(self.nvml, exc):
            self.unsupported.append({"field": field, "reason": "%s: %s" % (name, exc)})
        else:
            self.unreadable.append({"field": field, "error": "%s: %s (%s)" % (name, exc, type(exc).__name__)})

    def drop_unsupported(self, *fields):
        """Forget that ``fields`` are unsupported (the GPU has an alternative the checks read)."""
        self.unsupported = [u for u in self.unsupported if u["field"] not in fields]


def text(value):
    """NVML strings: bytes from older bindings, str from newer ones."""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value
