# -*- coding: utf-8 -*-
# SPDX-License-Identifier: GPL-3.0-or-later
"""Parse `vllm serve --config FILE` files with vLLM's OWN argument parser (run inside .vllm-venv).

    VLLM_TARGET_DEVICE=cpu .vllm-venv/bin/python tests/vllm_parser/parse_config.py FILE...
    ... parse_config.py --self-test
    ... parse_config.py --options [FILE...]   (first the option keys: what _vllm_options must hold)

Prints one JSON object per line: with --options first {"options": [...]}, then per file {"file",
"ok", "error", "args"} (args: the parsed values of the keys the file sets). vLLM is imported once
per run (about 13 s here), so a caller passes everything it needs in one run. Exit status 0 when
every file parsed, 1 otherwise.
"""

import contextlib
import io
import json
import os
import sys
import tempfile

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")


def make_parser():
    from vllm.entrypoints.common.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    return make_arg_parser(FlexibleArgumentParser(description="vllm serve (parser check)"))


def parse_file(parser, path):
    import yaml

    with open(path) as handle:
        keys = [k.replace("-", "_") for k in (yaml.safe_load(handle) or {})]
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            args = parser.parse_args(["--config", path])
    except SystemExit as exc:
        lines = [line for line in err.getvalue().splitlines() if "error:" in line] or err.getvalue().splitlines()[-1:]
        return {"file": path, "ok": False, "error": " ".join(lines).strip() or "exit %s" % exc.code, "args": {}}
    except Exception as exc:  # pylint: disable=broad-except
        return {"file": path, "ok": False, "error": "%s: %s" % (type(exc).__name__, exc), "args": {}}
    values = vars(args)
    missing = [k for k in keys if k not in values]
    if missing:
        return {"file": path, "ok": False, "error": "keys not known to the parser: %s" % missing, "args": {}}
    return {
        "file": path,
        "ok": True,
        "error": None,
        "args": {
            k: (values[k] if isinstance(values[k], (str, int, float, bool, type(None))) else str(values[k]))
            for k in keys
        },
    }


def self_test(parser):
    tmp = tempfile.mkdtemp()
    good = os.path.join(tmp, "good.yaml")
    bad = os.path.join(tmp, "bad.yaml")
    with open(good, "w") as handle:
        handle.write(
            "model: meta-llama/Llama-3.1-8B-Instruct\ntensor_parallel_size: 2\n"
            "max-model-len: 8192\nkv_cache_dtype: fp8\nenable_prefix_caching: true\n"
        )
    with open(bad, "w") as handle:
        handle.write("model: meta-llama/Llama-3.1-8B-Instruct\nswap_space: 4\n")
    ok, ko = parse_file(parser, good), parse_file(parser, bad)
    print(json.dumps(ok))
    print(json.dumps(ko))
    if not ok["ok"] or ko["ok"]:
        print("self-test failed: the parser must accept good.yaml and reject swap_space", file=sys.stderr)
        return 1
    return 0


def options(parser):
    """The keys a config file may carry: every action whose long option is its dest with dashes
    (the parser's own --config and --help left out), sorted."""
    return sorted(
        a.dest
        for a in parser._actions  # pylint: disable=protected-access
        if "--" + a.dest.replace("_", "-") in a.option_strings and a.dest not in ("config", "help")
    )


def main(argv):
    parser = make_parser()
    if argv[:1] == ["--self-test"]:
        return self_test(parser)
    if argv[:1] == ["--options"]:
        print(json.dumps({"options": options(parser)}))
        argv = argv[1:]
    status = 0
    for path in argv:
        result = parse_file(make_parser(), path)
        print(json.dumps(result))
        status |= 0 if result["ok"] else 1
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
