# SPDX-License-Identifier: GPL-3.0-or-later
"""Writes v0.33.0-two-engines.prom: the /metrics text of vLLM's own Prometheus stat logger, at
the release the collection pins, for two data-parallel engines.

Run with the vLLM venv of tests/vllm_parser/setup.sh (no GPU: VLLM_TARGET_DEVICE=cpu):

    ~/.cache/gpufleet/vllm-parser-venv-0.33.0/bin/python tests/data/vllm-metrics/make_sample.py

vLLM's PrometheusStatLogger (vllm/v1/metrics/loggers.py) is built from a real VllmConfig (a tiny
Llama config, no weights) and records one SchedulerStats and one IterationStats per engine, the
figures below; prometheus_client renders the registry as vLLM's /metrics does. The names, types,
labels and bucket bounds are vLLM's; the values are the ones recorded here. Kept: every vllm:
family's HELP and TYPE lines, and the samples of the families the collection reads; trimmed:
python_* and process_* families, the *_created gauges, the other families' samples.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

OUT = Path(__file__).with_name("v0.33.0-two-engines.prom")
# what each engine records: running, waiting, KV usage, preemptions, TTFTs and inter-token latencies (s)
ENGINES = {
    0: {
        "run": 5,
        "wait": 1,
        "kv": 0.42,
        "pre": 2,
        "ttft": [0.08, 0.12, 0.35, 0.9],
        "itl": [0.021, 0.025, 0.032, 0.04] * 5,
    },
    1: {"run": 2, "wait": 0, "kv": 0.17, "pre": 0, "ttft": [0.06, 0.11], "itl": [0.019, 0.022] * 5},
}
SAMPLES_KEPT = (
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:num_requests_waiting_by_reason",
    "vllm:kv_cache_usage_perc",
    "vllm:num_preemptions_total",
    "vllm:time_to_first_token_seconds",
    "vllm:inter_token_latency_seconds",
)


def exposition():
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    import prometheus_client
    import vllm
    from vllm.engine.arg_utils import EngineArgs
    from vllm.v1.metrics.loggers import PrometheusStatLogger
    from vllm.v1.metrics.stats import IterationStats, SchedulerStats

    model = Path(tempfile.mkdtemp()) / "model"
    model.mkdir()
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "num_hidden_layers": 2,
        "vocab_size": 1000,
        "max_position_embeddings": 2048,
        "torch_dtype": "float32",
        "rms_norm_eps": 1e-5,
    }
    (model / "config.json").write_text(json.dumps(config))
    args = EngineArgs(
        model=str(model),
        served_model_name=["Llama-3.3-70B-Instruct-FP8"],
        skip_tokenizer_init=True,
        max_model_len=2048,
    )
    logger = PrometheusStatLogger(args.create_engine_config(), engine_indexes=sorted(ENGINES))
    for index, e in ENGINES.items():
        iteration = IterationStats()
        iteration.num_preempted_reqs = e["pre"]
        iteration.time_to_first_tokens_iter = list(e["ttft"])
        iteration.inter_token_latencies_iter = list(e["itl"])
        iteration.num_generation_tokens = len(e["itl"])
        scheduler = SchedulerStats(num_running_reqs=e["run"], num_waiting_reqs=e["wait"], kv_cache_usage=e["kv"])
        logger.record(scheduler, iteration, engine_idx=index)
    return vllm.__version__, prometheus_client.generate_latest(prometheus_client.REGISTRY).decode()


def trim(text):
    families, order, current = {}, [], None
    for line in text.splitlines(keepends=True):
        if line.startswith(("# HELP ", "# TYPE ")):
            current = line.split()[2]
            if current not in families:
                families[current] = {"meta": [], "samples": []}
                order.append(current)
            families[current]["meta"].append(line)
        elif current is not None:
            families[current]["samples"].append(line)
    out = []
    for name in order:
        if not name.startswith("vllm:") or name.endswith("_created"):
            continue
        out += families[name]["meta"]
        if name in SAMPLES_KEPT:
            out += families[name]["samples"]
    return "".join(out)


def main():
    version, text = exposition()
    if version != "0.33.0":
        sys.exit(f"vLLM {version}, not the pinned 0.33.0")
    header = (
        "# SOURCE: https://github.com/vllm-project/vllm/blob/v0.33.0/vllm/v1/metrics/loggers.py (vLLM 0.33.0's\n"
        "# PrometheusStatLogger, two data-parallel engines), written by make_sample.py beside this file: the\n"
        "# names, types, labels and buckets are vLLM's, the values recorded there. Kept: the HELP and TYPE lines\n"
        "# of every vllm: family, the samples of the families the collection reads (see SOURCE.md).\n"
    )
    OUT.write_text(header + trim(text))
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
