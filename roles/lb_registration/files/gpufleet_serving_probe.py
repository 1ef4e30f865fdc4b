# -*- coding: utf-8 -*-
# SPDX-License-Identifier: GPL-3.0-or-later
"""gpufleet-serving-probe: whether this node's engine still answers, every few seconds.

Run by gpufleet-serving-probe.service (installed by the gpufleet.node.lb_registration role). Every
--interval seconds it asks the node's server for one token (``POST /v1/completions``,
``max_tokens: 1``, the served model, the API key read from --api-key-file) with a deadline
(--timeout), and samples the engine's own ``/metrics`` for forward progress. The rule is
gpufleet.node's (module_utils ``serving/_probe``, its record ``serving/_probe_record``):
``serving``, ``busy`` (slow, but tokens are being generated for running or waiting requests),
``wedged`` (no answer, no progress) or ``down``.

Each verdict goes, as JSON written atomically, to --record (beside the NCCL gate's marker under
/run), with the boot id, the time and the reason; the node's HAProxy agent reads it (module_utils
``nccl/_readiness``) and answers ``down #engine-wedged`` or ``down #engine-down`` while the engine
does not serve, so the balancer stops sending traffic at its next agent check. Nothing is
restarted. With --textfile the verdict is exported for node_exporter's textfile collector too.
A change of verdict is logged (the journal); the API key never is.

    python3 /usr/local/lib/gpufleet/gpufleet_serving_probe.py --url http://127.0.0.1:8000
        --model NAME --record /run/gpufleet/serving-probe.json [--api-key-file PATH]
        [--boot-id PATH] [--interval S] [--timeout S] [--priority N] [--backend NAME]
        [--textfile PATH] [--once]

Exit status: 0 (``--once``: the engine serves), 1 (``--once``: it does not), 2 (bad arguments, an
unreadable key file, or the collection's code missing beside this file).
"""

import argparse
import json
import os
import sys
import time

VERDICT_CODES = {"serving": 0, "busy": 1, "wedged": 2, "down": 3}


def log(message):
    print("gpufleet-serving-probe: %s" % message, flush=True)


def load_rules():
    """The collection's probe rule (``_probe``) and its record (``_probe_record``), and what the
    prober needs besides (``_atomic``, ``_readiness`` for the boot id, ``_textfile`` for the
    metrics), from the copy of module_utils the role installs beside this file."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from ansible_collections.gpufleet.node.plugins.module_utils.common import _atomic, _textfile
    from ansible_collections.gpufleet.node.plugins.module_utils.nccl import _readiness
    from ansible_collections.gpufleet.node.plugins.module_utils.serving import _probe, _probe_record

    return _atomic, _readiness, _probe, _probe_record, _textfile


def read_key(path):
    """The API key in ``path`` (empty: none); SystemExit naming the file when it cannot be read."""
    if not path:
        return None
    try:
        with open(path) as handle:
            return handle.read().strip() or None
    except OSError as exc:
        raise SystemExit(
            "gpufleet-serving-probe: cannot read the API key file %s: %s" % (path, exc.strerror or exc)
        ) from None


def textfile(builder, verdict, elapsed, stamp, deadline):
    """node_exporter textfile metrics of one probe (``builder``: the collection's ``_textfile``)."""
    out = builder.Exposition()
    out.metric(
        "gpufleet_serving_probe_up",
        "gauge",
        "Whether the serving probe finds the engine serving (1: serving or busy).",
        [((), 1 if verdict in ("serving", "busy") else 0)],
    )
    out.metric(
        "gpufleet_serving_probe_verdict",
        "gauge",
        "The serving probe's last verdict (1 for the verdict it gave).",
        [((("verdict", v),), int(v == verdict)) for v in VERDICT_CODES],
    )
    out.metric(
        "gpufleet_serving_probe_duration_seconds",
        "gauge",
        "How long the last probe's completion took.",
        [((), float("nan") if elapsed is None else float(elapsed))],
    )
    out.metric(
        "gpufleet_serving_probe_deadline_seconds",
        "gauge",
        "The probe's deadline for its completion (--timeout).",
        [((), float(deadline))],
    )
    out.metric(
        "gpufleet_serving_probe_timestamp_seconds",
        "gauge",
        "When the last probe ended (Unix time).",
        [((), float(stamp))],
        decimals=3,
    )
    return out.text()


def probe_once(args, rules, key, last=None):
    """Probe, write the record (and the textfile); returns the verdict."""
    _atomic, _readiness, _probe, _probe_record, _textfile = rules
    try:
        boot_id = _readiness.read_boot_id(args.boot_id)
    except OSError as exc:
        # written all the same: the agent cannot read the boot id either and says so
        boot_id = None
        if last is None:
            log("cannot read the boot id at %s: %s" % (args.boot_id, exc.strerror or exc))
    verdict, reason, elapsed = _probe.probe(args.url, args.model, key, args.timeout, args.priority)
    record = _probe_record.record(verdict, reason, boot_id, elapsed, args.backend, args.interval, args.timeout)
    _atomic.write(args.record, json.dumps(record, sort_keys=True) + "\n")
    if args.textfile:
        _atomic.write(args.textfile, textfile(_textfile, verdict, elapsed, record["time"], args.timeout))
    if verdict != last:
        log("%s: %s (%.1f s)" % (verdict, reason, elapsed or 0.0))
    return verdict


def parse_args(argv=None):
    """The prober's arguments (SystemExit 2, with the usage, on bad ones)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True, help="the server, http://127.0.0.1:PORT")
    parser.add_argument("--model", required=True, help="the served model name")
    parser.add_argument("--record", required=True, help="where the probe record is written (JSON)")
    parser.add_argument("--api-key-file", default="", help="a file holding the server's API key")
    parser.add_argument("--boot-id", default="/proc/sys/kernel/random/boot_id")
    parser.add_argument("--interval", type=float, default=5.0, help="seconds between probes")
    parser.add_argument("--timeout", type=float, default=10.0, help="the completion's deadline (s)")
    parser.add_argument("--priority", type=int, default=None, help="vLLM's request priority (lower first)")
    parser.add_argument("--backend", default="", help="vllm or llamacpp (recorded)")
    parser.add_argument("--textfile", default="", help="node_exporter textfile (.prom) to write")
    parser.add_argument("--once", action="store_true", help="probe once and exit")
    args = parser.parse_args(argv)
    if not (args.interval > 0 and args.timeout > 0):
        parser.error("--interval and --timeout must be above 0")
    return args


def main(argv=None):
    args = parse_args(argv)
    try:
        rules = load_rules()
    except ImportError as exc:
        sys.stderr.write("gpufleet-serving-probe: the collection's code is missing beside %s: %s\n" % (__file__, exc))
        return 2
    key = read_key(args.api_key_file)
    if args.once:
        return 0 if probe_once(args, rules, key) in ("serving", "busy") else 1
    log("probing %s (model %s) every %g s, deadline %g s" % (args.url, args.model, args.interval, args.timeout))
    last = None
    while True:
        started = time.monotonic()
        last = probe_once(args, rules, key, last)
        time.sleep(max(0.0, args.interval - (time.monotonic() - started)))


if __name__ == "__main__":
    sys.exit(main())
