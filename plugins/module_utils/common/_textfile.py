# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""node_exporter textfile metrics in the Prometheus text exposition format: the one builder of
every ``.prom`` file the collection writes (the GPU health history, the serving prober, the
worker-recycle agent, the drift report).

Each metric family gets its ``# HELP`` and ``# TYPE`` lines, then one line per sample; metric
and label names are checked against the format's grammar, label values escaped as the format
says (backslash, double quote, line feed) and ``# HELP`` text too (backslash, line feed).
Standard library only, importable on its own (the node-side agents run it from the copy their
roles install beside them).

    out = Exposition()
    out.metric("gpufleet_x_total", "counter", "What it counts.", [({"gpu": bdf}, 3)])
    text = out.text()
"""

from __future__ import annotations

import math
import re

#: The metric types a textfile here declares (histograms and summaries need their own series).
KINDS = ("counter", "gauge", "untyped")
METRIC_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")


class TextfileError(ValueError):
    """A metric or label name the format does not allow, an unknown type, a value that is not a
    number, or a metric family given twice."""


def escape_label(value):
    """A label value as the text format writes it between double quotes."""
    return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def escape_help(text):
    """``# HELP`` text as the text format writes it."""
    return str(text).replace("\\", "\\\\").replace("\n", "\\n")


def value_text(value, decimals=None):
    """A sample value: an integer (or bool) as one, a float as Python's shortest round-trip form
    or with ``decimals`` places; NaN and the infinities by the format's names."""
    if isinstance(value, bool):
        value = int(value)
    if isinstance(value, int):
        return "%d" % value
    if not isinstance(value, float):
        raise TextfileError("a sample value must be a number, got %r" % (value,))
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(value) if decimals is None else "%.*f" % (decimals, value)


def _labels(labels):
    pairs = list(labels.items()) if hasattr(labels, "items") else list(labels or ())
    for name, _value in pairs:
        if not LABEL_NAME.match(str(name)) or str(name).startswith("__"):
            raise TextfileError("%r is not a label name of the Prometheus text format" % (name,))
    if len({name for name, _value in pairs}) != len(pairs):
        raise TextfileError("a label given twice in %r" % (pairs,))
    if not pairs:
        return ""
    return "{%s}" % ",".join('%s="%s"' % (name, escape_label(value)) for name, value in pairs)


class Exposition:
    """The lines of one textfile, metric family after metric family."""

    def __init__(self):
        self.lines = []
        self.names = set()

    def metric(self, name, kind, help_text, samples=(), decimals=None):
        """Add one metric family: ``samples`` are ``(labels, value)`` pairs (labels a mapping or
        ``(name, value)`` pairs, in the order written; a value of None is left out). A family
        without samples keeps its ``# HELP`` and ``# TYPE`` lines. Returns ``self``."""
        if not METRIC_NAME.match(str(name)):
            raise TextfileError("%r is not a metric name of the Prometheus text format" % (name,))
        if kind not in KINDS:
            raise TextfileError("%s: type %r, not one of %s" % (name, kind, ", ".join(KINDS)))
        if name in self.names:
            raise TextfileError("%s: the metric family is given twice" % name)
        self.names.add(name)
        lines = ["# HELP %s %s" % (name, escape_help(help_text)), "# TYPE %s %s" % (name, kind)]
        for labels, value in samples:
            if value is not None:
                lines.append("%s%s %s" % (name, _labels(labels), value_text(value, decimals)))
        self.lines.extend(lines)
        return self

    def text(self):
        """The textfile: every line, each ended by a line feed."""
        return "".join(line + "\n" for line in self.lines)
