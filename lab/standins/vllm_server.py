# SPDX-License-Identifier: GPL-3.0-or-later
"""`vllm serve` for a lab machine: the same command line and config file as vLLM 0.33.0, the same
start-up refusals, and an OpenAI-style server with `/health`, `/v1/models` and `/metrics`.

The machine is the one `lab.hwmodel.build()` laid out under $GPUFLEET_LAB_ROOT.  Its GPUs (those
bound to the `nvidia` driver, filtered by CUDA_VISIBLE_DEVICES like CUDA does) decide whether the
engine starts: weights are split over tensor x pipeline ranks and the KV pool is what remains of
`memory_total x gpu_memory_utilization` after the weights and what vLLM measures at start-up.  A
pool <= 0 or one that cannot hold a single `max_model_len` request ends start-up with vLLM's own
ValueError text (vllm/v1/core/kv_cache_planning.py, 0.33.0) and exit status 1.

The memory constants are the lab's own ("what the GPU measured"), deliberately not the
collection's planner (plugins/module_utils/serving/_kvplan.py), which estimates them more conservatively:
the stand-in must not share the bugs of what it tests.

    vllm serve [MODEL] [--config FILE] [--host H] [--port P] [--tensor-parallel-size N] ...

Flags not known to vLLM 0.33.0 (for example `--swap-space`, `--calculate-kv-scales`) are refused
as vLLM's argument parser refuses them (exit 2).  Environment: GPUFLEET_LAB_VLLM_STARTUP_S
(seconds before the port opens, default 1), VLLM_API_KEY (or --api-key: /v1 needs a bearer token).

The lab's `engine-wedge` fault (the hardware model's fault channel, lab/hwmodel/health.py) wedges
a server started before it: `/health`, `/v1/models` and `/metrics` answer (the metrics frozen),
completions never return. A server started after it (a restart of the unit) serves again.

Serving (lab/standins/vllm_engine.py): `/v1/completions` and `/v1/chat/completions`, streamed
(server-sent events, as vLLM's OpenAI server sends them) or not, run by a small continuous-batching
engine whose KV pool is this node's (blocks of `block_size` tokens), whose admission follows
`max_num_seqs` and `max_num_batched_tokens`, and which preempts the newest request when a decode
step finds no free block.  TTFT and inter-token latency therefore respond to load and capacity, and
`/metrics` counts what happened (gauges, counters, histograms with vLLM's buckets).  Knobs, from the
environment (a systemd drop-in in the lab):

    GPUFLEET_LAB_VLLM_PREFILL_TPS        prefill tokens per second (default 20000)
    GPUFLEET_LAB_VLLM_ITL_S              decode step time with one sequence (default 0.02)
    GPUFLEET_LAB_VLLM_ITL_PER_SEQ_S      added per running sequence (default 0.0002)
    GPUFLEET_LAB_VLLM_KV_TOKENS          KV pool in tokens (default: what the node's GPUs hold)
    GPUFLEET_LAB_VLLM_RSS_GROWTH_MIB_S   resident memory the server leaks per second (default 0)
    GPUFLEET_LAB_VLLM_RSS_TTFT_S_PER_GIB added prefill time per GiB leaked (fragmentation, default 2)
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import signal
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import yaml

from lab.hwmodel import Node
from lab.standins.vllm_engine import Engine, EngineError, RSSLeak, prompt_tokens

GiB = 1024**3
MiB = 1024**2
VERSION = "0.33.0"
STARTUP_ENV = "GPUFLEET_LAB_VLLM_STARTUP_S"
# bytes per parameter of a quantized checkpoint's quantized layers
_QUANT_BYTES = {"fp8": 1}


def _load_checkpoints():
    """The checkpoints this lab "has": hf id -> (layers, kv heads, head_dim, bytes of the weights,
    MLA latent width or 0, hidden, vocab).

    Their shapes come from ONE place, the collection's data file
    ``plugins/module_utils/serving/_model_profiles.py`` (config.json fields and parameter counts), loaded by
    its path: the shape of a checkpoint is the fact this stand-in simulates, as the hardware model's
    GPUs are, so the planner and the lab cannot disagree about it. Nothing else of the collection is
    imported (not the planner, which this stand-in checks): the bytes a checkpoint takes on the GPU
    and the memory vLLM measures at start-up are the lab's own arithmetic below, written from vLLM's
    behaviour (quantized checkpoints keep the embeddings and lm_head in 16 bits), not from _kvplan.
    """
    path = Path(__file__).resolve().parents[2] / "plugins" / "module_utils" / "serving" / "_model_profiles.py"
    spec = importlib.util.spec_from_file_location("_gpufleet_lab_model_profiles", path)
    data = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(data)
    table = {}
    for name, p in data.MODEL_PROFILES.items():
        quant = p.get("quantization")
        if quant and quant not in _QUANT_BYTES:
            raise RuntimeError(
                f"lab vLLM stand-in: no byte width for the {quant} checkpoint {name}; add it to _QUANT_BYTES"
            )
        wbytes = _QUANT_BYTES.get(quant, 2)
        params, hidden, vocab = p["num_parameters"], p["hidden_size"], p["vocab_size"]
        embed = vocab * hidden * (1 if p.get("tie_word_embeddings") else 2) if quant else 0
        loaded = (params - embed) * wbytes + embed * 2
        latent = p.get("kv_lora_rank", 0) + p.get("qk_rope_head_dim", 0) if p.get("kv_lora_rank") else 0
        heads = p["num_attention_heads"]
        table[p["hf_id"]] = (
            p["num_hidden_layers"],
            p.get("num_key_value_heads") or heads,
            p.get("head_dim") or hidden // heads,
            loaded,
            latent,
            hidden,
            vocab,
        )
    return table


CHECKPOINTS = _load_checkpoints()
# Options this stand-in understands (long names, underscores) and their defaults; any other option
# vLLM 0.33.0 has is accepted and ignored.  REMOVED ones fail like vLLM's parser fails on them.
OPTIONS = {
    "model": None,
    "served_model_name": None,
    "host": None,
    "port": 8000,
    "tensor_parallel_size": 1,
    "pipeline_parallel_size": 1,
    "dtype": "auto",
    "kv_cache_dtype": "auto",
    "gpu_memory_utilization": 0.92,
    "kv_cache_memory_bytes": None,
    "max_model_len": None,
    "block_size": 16,
    "max_num_batched_tokens": None,
    "max_num_seqs": None,
    "enable_prefix_caching": True,
    "shutdown_timeout": 0,
    "api_key": None,
    "enforce_eager": False,
    "trust_remote_code": False,
    "disable_log_stats": False,
    "enable_log_requests": False,
    "enable_chunked_prefill": True,
    "max_logprobs": 20,
    "seed": 0,
    "download_dir": None,
    "quantization": None,
    "uvicorn_log_level": "info",
}
REMOVED = (
    "swap_space",
    "calculate_kv_scales",
    "num_scheduler_steps",
    "use_v2_block_manager",
    "preemption_mode",
    "max_seq_len_to_capture",
)
BOOLEAN = {k for k, v in OPTIONS.items() if isinstance(v, bool)}


def log(level, msg):
    stamp = time.strftime("%m-%d %H:%M:%S")
    print(f"{level} {stamp} [lab-vllm] {msg}", file=sys.stderr, flush=True)


def usage_error(msg):
    print("usage: vllm serve [model_tag] [--config CONFIG] [options]", file=sys.stderr)
    print(f"vllm: error: {msg}", file=sys.stderr)
    return 2


def parse(argv):
    """argv after `serve` -> (options dict, error exit code or None)."""
    opts = {}
    positional = []
    cli = {}
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg.startswith("--"):
            key, eq, value = arg[2:].partition("=")
            key = key.replace("-", "_")
            flag = key in BOOLEAN or key.startswith(("enable_", "disable_", "no_"))
            if flag and not eq:
                if key.startswith("no_"):
                    cli[key[3:]] = False
                elif key.startswith("disable_") and "enable_" + key[8:] in OPTIONS:
                    cli["enable_" + key[8:]] = False
                else:
                    cli[key] = True
            elif flag:
                cli[key] = value.lower() in ("1", "true", "yes")
            else:
                if not eq:
                    i += 1
                    if i >= len(argv):
                        return None, usage_error(f"argument --{key.replace('_', '-')}: expected one argument")
                    value = argv[i]
                cli[key] = value
        else:
            positional.append(arg)
        i += 1
    if "config" in cli:
        try:
            with open(cli.pop("config")) as handle:
                loaded = yaml.safe_load(handle) or {}
        except (OSError, yaml.YAMLError) as exc:
            return None, usage_error(f"argument --config: {exc}")
        opts.update({str(k).replace("-", "_"): v for k, v in loaded.items()})
    opts.update(cli)  # CLI > file > defaults
    bad = [k for k in opts if k in REMOVED]
    if bad:
        return None, usage_error("unrecognized arguments: " + " ".join("--" + k.replace("_", "-") for k in bad))
    if positional:
        opts["model"] = positional[0]
    merged = dict(OPTIONS)
    merged.update(opts)
    for key in (
        "port",
        "tensor_parallel_size",
        "pipeline_parallel_size",
        "block_size",
        "max_model_len",
        "max_num_batched_tokens",
        "max_num_seqs",
        "kv_cache_memory_bytes",
        "shutdown_timeout",
    ):
        if merged.get(key) is not None:
            try:
                merged[key] = int(merged[key])
            except (TypeError, ValueError):
                return None, usage_error(f"argument --{key.replace('_', '-')}: invalid int value: {merged[key]!r}")
    merged["gpu_memory_utilization"] = float(merged["gpu_memory_utilization"])
    if isinstance(merged.get("served_model_name"), list):
        merged["served_model_name"] = merged["served_model_name"][0]
    if not merged.get("model"):
        merged["model"] = "Qwen/Qwen3-0.6B"  # vLLM's default model
    return merged, None


def visible_gpus(node):
    gpus = [g for g in node.gpus if g.driver in (None, "nvidia")]
    mask = os.environ.get("CUDA_VISIBLE_DEVICES")
    if mask is not None and mask.strip() != "":
        keep = [int(x) for x in mask.split(",") if x.strip().isdigit()]
        gpus = [gpus[i] for i in keep if i < len(gpus)]
    return gpus


def engine_check(opts, gpus):
    """Start-up as vLLM does it; returns (error text or None, facts dict)."""
    model = opts["model"]
    if model not in CHECKPOINTS:
        return (
            f"OSError: {model} is not a local folder and is not a valid model identifier listed on "
            f"'https://huggingface.co/models'"
        ), {}
    layers, kv_heads, head_dim, loaded, mla, hidden, vocab = CHECKPOINTS[model]
    tp, pp = opts["tensor_parallel_size"], opts["pipeline_parallel_size"]
    world = tp * pp
    if world > len(gpus):
        return (
            f"ValueError: World size ({world}) is larger than the number of available GPUs "
            f"({len(gpus)}) in this node. If this is intentional, you may want to start a Ray "
            f"cluster."
        ), {}
    total = min(g.memory_total_mib for g in gpus[:world]) * MiB
    requested = total * opts["gpu_memory_utilization"]
    weights = loaded / world
    if weights > total:
        return (
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.75 GiB. GPU 0 has a "
            f"total capacity of {total / GiB:.2f} GiB of which 0 bytes is free."
        ), {}
    kv_bytes = 1 if str(opts["kv_cache_dtype"]).startswith("fp8") else 2
    per_layer = mla * kv_bytes if mla else 2 * max(1, kv_heads // tp) * head_dim * kv_bytes
    layers_here = math.ceil(layers / pp)
    batched = opts["max_num_batched_tokens"] or (8192 if total >= 70 * GiB else 2048)
    seqs = opts["max_num_seqs"] or (1024 if total >= 70 * GiB else 256)
    measured = (
        (0.8 * GiB if world > 1 else 0.3 * GiB)
        + (0 if opts["enforce_eager"] else 0.4 * GiB)
        + batched * hidden * 6 * 2 / max(1, tp)
        + seqs * vocab * 4
    )
    if opts.get("kv_cache_memory_bytes"):
        pool = opts["kv_cache_memory_bytes"]
    else:
        pool = int(requested - weights - measured)
    max_len = opts["max_model_len"] or 131072
    block = opts["block_size"]
    page = per_layer * layers_here * block
    facts = {
        "pool": pool,
        "weights": weights,
        "requested": requested,
        "max_model_len": max_len,
        "max_num_batched_tokens": batched,
        "max_num_seqs": seqs,
    }
    if pool <= 0:
        return (
            "ValueError: No available memory for the cache blocks. Try increasing "
            "`gpu_memory_utilization` when initializing the engine (this flag also controls CPU memory "
            "reservation on the CPU backend, despite its name). See "
            "https://docs.vllm.ai/en/latest/configuration/conserving_memory/ for more details."
        ), facts
    blocks = pool // page
    needed = math.ceil(max_len / block) * page
    if needed > pool:
        estimate = blocks * block
        est = (
            f"Based on the available memory, the estimated maximum model length is {estimate}. " if estimate > 0 else ""
        )
        return (
            "ValueError: To serve at least one request with the model's max seq len "
            f"({max_len}), ({round(needed / GiB, 2)} GiB KV cache is needed, which is larger than the "
            f"available KV cache memory ({round(pool / GiB, 2)} GiB). {est}Try increasing "
            "`gpu_memory_utilization` (which also controls CPU memory on the CPU backend) or decreasing "
            "`max_model_len` when initializing the engine. See "
            "https://docs.vllm.ai/en/latest/configuration/conserving_memory/ for more details."
        ), facts
    facts.update(
        blocks=blocks,
        tokens=int(blocks / math.ceil(max_len / block) * max_len),
        concurrency=blocks / math.ceil(max_len / block),
    )
    return None, facts


class WedgeWatch:
    """Whether the lab wedged this server's engine: an `engine-wedge` fault injected after the
    server started (``started``, epoch s). The fault channel is read at most every half second."""

    def __init__(self, node, started, every=0.5):
        self.node, self.started, self.every = node, started, every
        self.read_at, self.wedged = -math.inf, False

    def __call__(self):
        now = time.monotonic()
        if now - self.read_at >= self.every:
            self.read_at = now
            try:
                at = self.node.health.get("engine_wedge")
            except (OSError, ValueError):
                at = None
            self.wedged = at is not None and at >= self.started
        return self.wedged


class Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True


def make_handler(opts, facts, engine=None):
    served = opts.get("served_model_name") or opts["model"]
    api_key = opts.get("api_key") or os.environ.get("VLLM_API_KEY")
    started = int(time.time())

    class Handler(BaseHTTPRequestHandler):
        server_version = "uvicorn"
        sys_version = ""

        def log_message(self, fmt, *args):  # uvicorn-like access log on stderr
            log("INFO", '%s - "%s" %s' % (self.client_address[0], self.requestline, args[1] if len(args) > 1 else ""))

        def _send(self, code, body=b"", ctype="application/json"):
            self.send_response(code)
            self.send_header("content-type", ctype)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def do_GET(self):
            path = self.path.split("?", 1)[0]
            if path == "/health":
                return self._send(200, b"")
            if path == "/metrics":
                text = engine.metrics(served) if engine else metrics(served)
                return self._send(200, text.encode(), "text/plain; version=0.0.4; charset=utf-8")
            if path.startswith("/v1/") and api_key and self.headers.get("Authorization") != f"Bearer {api_key}":
                return self._send(401, json.dumps({"error": "Unauthorized"}).encode())
            if path == "/v1/models":
                body = {
                    "object": "list",
                    "data": [
                        {
                            "id": served,
                            "object": "model",
                            "created": started,
                            "owned_by": "vllm",
                            "root": opts["model"],
                            "parent": None,
                            "max_model_len": facts["max_model_len"],
                            "permission": [],
                        }
                    ],
                }
                return self._send(200, json.dumps(body).encode())
            if path == "/version":
                return self._send(200, json.dumps({"version": VERSION}).encode())
            return self._send(404, json.dumps({"detail": "Not Found"}).encode())

        do_HEAD = do_GET

        def do_POST(self):
            path = self.path.split("?", 1)[0]
            if path.startswith("/v1/") and api_key and self.headers.get("Authorization") != f"Bearer {api_key}":
                return self._send(401, json.dumps({"error": "Unauthorized"}).encode())
            if path not in ("/v1/completions", "/v1/chat/completions") or engine is None:
                return self._send(404, json.dumps({"detail": "Not Found"}).encode())
            try:
                body = json.loads(self.rfile.read(int(self.headers.get("content-length") or 0)) or b"{}")
            except ValueError as exc:
                return self._error(400, f"Invalid JSON body: {exc}", "BadRequestError")
            if body.get("model", served) != served:
                return self._error(404, f"The model `{body.get('model')}` does not exist.", "NotFoundError")
            chat = path.endswith("chat/completions")
            n_prompt = prompt_tokens(body.get("messages") if chat else body.get("prompt"))
            max_tokens = int(body.get("max_tokens") or body.get("max_completion_tokens") or 16)
            if n_prompt + max_tokens > facts["max_model_len"]:
                return self._error(
                    400,
                    (
                        f"This model's maximum context length is {facts['max_model_len']} tokens. However, you "
                        f"requested {n_prompt + max_tokens} tokens ({n_prompt} in the messages, {max_tokens} in the "
                        "completion). Please reduce the length of the messages or completion."
                    ),
                    "BadRequestError",
                )
            try:
                request = engine.submit(n_prompt, max_tokens)
            except EngineError as exc:
                return self._error(503, str(exc), "ServiceUnavailableError")
            if body.get("stream"):
                include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
                return self._stream(request, chat, include_usage)
            tokens = list(request.tokens())
            text = "".join(tokens)
            choice = (
                {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "length"}
                if chat
                else {"index": 0, "text": text, "logprobs": None, "finish_reason": "length"}
            )
            out = {
                "id": request.id,
                "object": "chat.completion" if chat else "text_completion",
                "created": int(time.time()),
                "model": served,
                "choices": [choice],
                "usage": {
                    "prompt_tokens": n_prompt,
                    "completion_tokens": len(tokens),
                    "total_tokens": n_prompt + len(tokens),
                },
            }
            return self._send(200, json.dumps(out).encode())

        def _error(self, code, message, kind):
            body = {"error": {"message": message, "type": kind, "param": None, "code": code}}
            return self._send(code, json.dumps(body).encode())

        def _stream(self, request, chat, include_usage):
            self.send_response(200)
            self.send_header("content-type", "text/event-stream; charset=utf-8")
            self.send_header("connection", "close")
            self.end_headers()
            kind = "chat.completion.chunk" if chat else "text_completion"
            created = int(time.time())
            count = 0
            try:
                for token in request.tokens():
                    count += 1
                    choice = (
                        {"index": 0, "delta": {"content": token}, "logprobs": None, "finish_reason": None}
                        if chat
                        else {"index": 0, "text": token, "logprobs": None, "finish_reason": None, "stop_reason": None}
                    )
                    if count == request.max_tokens:
                        choice["finish_reason"] = "length"
                    chunk = {"id": request.id, "object": kind, "created": created, "model": served, "choices": [choice]}
                    self.wfile.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
                    self.wfile.flush()
                if include_usage:
                    chunk = {
                        "id": request.id,
                        "object": kind,
                        "created": created,
                        "model": served,
                        "choices": [],
                        "usage": {
                            "prompt_tokens": request.prompt_len,
                            "completion_tokens": count,
                            "total_tokens": request.prompt_len + count,
                        },
                    }
                    self.wfile.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
                self.wfile.write(b"data: [DONE]\n\n")
                self.wfile.flush()
            except (BrokenPipeError, ConnectionResetError):
                request.abort()
            self.close_connection = True

    return Handler


def metrics(served):
    labels = f'engine="0",model_name="{served}"'
    lines = []
    for name, kind, helptext in (
        ("vllm:num_requests_running", "gauge", "Number of requests in model execution batches."),
        ("vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed."),
        ("vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage."),
        ("vllm:num_preemptions_total", "counter", "Cumulative number of preemption from the engine."),
        ("vllm:prompt_tokens_total", "counter", "Number of prefill tokens processed."),
        ("vllm:generation_tokens_total", "counter", "Number of generation tokens processed."),
    ):
        lines += [f"# HELP {name} {helptext}", f"# TYPE {name} {kind}", f"{name}{{{labels}}} 0.0"]
    for name, helptext in (
        ("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds."),
        ("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds."),
        ("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds."),
    ):
        lines += [
            f"# HELP {name} {helptext}",
            f"# TYPE {name} histogram",
            f'{name}_bucket{{{labels},le="+Inf"}} 0.0',
            f"{name}_count{{{labels}}} 0.0",
            f"{name}_sum{{{labels}}} 0.0",
        ]
    return "\n".join(lines) + "\n"


def serve(argv):
    opts, code = parse(argv)
    if code is not None:
        return code
    log("INFO", f"vLLM API server version {VERSION}")
    log("INFO", "non-default args: %s" % {k: v for k, v in opts.items() if OPTIONS.get(k) != v and k != "api_key"})
    try:
        node = Node.load()
    except RuntimeError as exc:
        print(f"RuntimeError: Failed to infer device type ({exc})", file=sys.stderr)
        return 1
    gpus = visible_gpus(node)
    if not gpus:
        print("RuntimeError: Failed to infer device type", file=sys.stderr)
        return 1
    error, facts = engine_check(opts, gpus)
    if facts.get("weights"):
        log("INFO", "Model loading took %.2f GiB memory" % (facts["weights"] / GiB))
    if "pool" in facts:
        log("INFO", "Available KV cache memory: %s GiB" % round(facts["pool"] / GiB, 2))
    if error:
        print(error, file=sys.stderr)
        print(
            "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}",
            file=sys.stderr,
        )
        return 1
    log(
        "INFO",
        "GPU KV cache size: {:,} tokens, Maximum concurrency for {:,} tokens per request: {:.2f}x".format(
            facts["tokens"], facts["max_model_len"], facts["concurrency"]
        ),
    )
    time.sleep(float(os.environ.get(STARTUP_ENV, "1")))
    host = opts.get("host") or "0.0.0.0"
    engine = Engine.from_environment(opts, facts, os.environ)
    engine.wedged = WedgeWatch(node, time.time())
    leak = RSSLeak.from_environment(os.environ, engine)
    try:
        httpd = Server((host, opts["port"]), make_handler(opts, facts, engine))
    except OSError as exc:
        print(
            f"OSError: [Errno {exc.errno}] error while attempting to bind on address "
            f"('{host}', {opts['port']}): {exc.strerror}",
            file=sys.stderr,
        )
        return 1

    def stop(signum, _frame):
        log("INFO", "Shutting down FastAPI HTTP server.")
        threading.Thread(target=httpd.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    log("INFO", f"Starting vLLM API server 0 on http://{host}:{opts['port']}")
    log("INFO", "Application startup complete.")
    engine.start()
    if leak:
        leak.start()
    httpd.serve_forever()
    httpd.server_close()
    return 0


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] in (["--version"], ["-v"]):
        print(VERSION)
        return 0
    if argv[:1] != ["serve"]:
        return usage_error("only `vllm serve` is simulated in the lab")
    return serve(argv[1:])


if __name__ == "__main__":
    sys.exit(main())
