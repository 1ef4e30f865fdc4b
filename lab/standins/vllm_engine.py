# SPDX-License-Identifier: GPL-3.0-or-later
"""The lab vLLM stand-in's engine: continuous batching over a paged KV pool, in one thread.

Each step (as vLLM V1's scheduler does it, much simplified):

1. every running request that has finished its prefill decodes one token; one that needs a new
   KV block when none is free preempts the most recently admitted request (its blocks are freed,
   it goes back to the front of the waiting queue and must prefill again: recomputation), and
   ``vllm:num_preemptions_total`` counts it;
2. waiting requests are admitted first come first served while fewer than ``max_num_seqs`` run,
   their prompt's blocks are free, and the step's token budget (``max_num_batched_tokens``,
   chunked prefill) lasts;
3. the step takes ``itl + itl_per_seq x decoding + prefill tokens / prefill_tps`` seconds (plus the
   fragmentation penalty of leaked memory on steps that prefill), then the tokens are handed out.

So TTFT = queueing + prefill under contention, inter-token latency grows with the batch, and the
KV usage gauge is used blocks / pool blocks.  A wedged engine (``wedged()`` true: the lab's
`engine-wedge` fault, read by the server) takes no step: requests wait for ever and `/metrics`
repeats what it said when the engine wedged, as a hung engine core's server does.  Metrics are kept as vLLM keeps them (histograms with
vLLM's default buckets).  Standard library only (the nodes run it under Debian's python3).
"""

from __future__ import annotations

import itertools
import math
import queue
import threading
import time
import uuid
from collections import deque

GiB = 1024**3
MiB = 1024**2

TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)  # fmt: skip
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)  # fmt: skip
E2E_BUCKETS = (
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
)
WORDS = (" the", " lab", " node", " serves", " tokens", " of", " a", " simulated", " model", ".")


class EngineError(Exception):
    pass


def prompt_tokens(prompt):
    """Token count of a completions `prompt` (text, token ids, or a list of them) or chat messages."""
    if prompt is None:
        return 1
    if isinstance(prompt, str):
        return max(1, math.ceil(len(prompt) / 4))  # ~4 characters a token, OpenAI's rule of thumb
    if isinstance(prompt, list):
        if prompt and all(isinstance(t, int) for t in prompt):
            return len(prompt)
        total = 0
        for item in prompt:
            if isinstance(item, dict):  # a chat message
                total += 4 + prompt_tokens(item.get("content") or "")
            else:
                total += prompt_tokens(item)
        return max(1, total)
    return 1


class Histogram:
    def __init__(self, bounds):
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0

    def observe(self, value):
        for i, bound in enumerate(self.bounds):
            if value <= bound:
                self.counts[i] += 1
                break
        else:
            self.counts[-1] += 1
        self.sum += value

    def lines(self, name, labels):
        out, cum = [], 0
        for bound, count in zip(list(self.bounds) + ["+Inf"], self.counts, strict=False):
            cum += count
            out.append(f'{name}_bucket{{{labels},le="{float(bound) if bound != "+Inf" else bound}"}} {float(cum)}')
        out.append(f"{name}_count{{{labels}}} {float(cum)}")
        out.append(f"{name}_sum{{{labels}}} {self.sum}")
        return out


class Request:
    _ids = itertools.count()

    def __init__(self, engine, prompt_len, max_tokens):
        self.engine = engine
        self.id = f"cmpl-{uuid.uuid4().hex}"
        self.seq = next(self._ids)
        self.prompt_len = prompt_len
        self.max_tokens = max_tokens
        self.arrival = time.monotonic()
        self.generated = 0
        self.prefilled = 0  # tokens of (prompt + generated) computed into the KV cache
        self.blocks = 0
        self.first_token = None
        self.last_token = None
        self.admitted_at = None
        self.done = False
        self.aborted = False
        self.out = queue.Queue()

    @property
    def length(self):
        return self.prompt_len + self.generated

    def tokens(self):
        """Yield the generated tokens as the engine produces them."""
        while True:
            item = self.out.get()
            if item is None:
                return
            yield item

    def abort(self):
        self.aborted = True


class Engine:
    def __init__(
        self,
        kv_tokens,
        block_size=16,
        max_num_seqs=256,
        max_num_batched_tokens=2048,
        prefill_tps=20000.0,
        itl=0.02,
        itl_per_seq=0.0002,
        frag_s_per_gib=2.0,
    ):
        self.block_size = max(1, int(block_size))
        self.total_blocks = max(1, int(kv_tokens) // self.block_size)
        self.max_num_seqs = max(1, int(max_num_seqs))
        self.budget = max(1, int(max_num_batched_tokens))
        self.prefill_tps = float(prefill_tps)
        self.itl = float(itl)
        self.itl_per_seq = float(itl_per_seq)
        self.frag_s_per_gib = float(frag_s_per_gib)
        self.leaked_bytes = 0
        self.cond = threading.Condition()
        self.waiting = deque()
        self.running = []
        self.used_blocks = 0
        self.preemptions = 0
        self.prompt_total = 0
        self.generation_total = 0
        self.success = 0
        self.ttft = Histogram(TTFT_BUCKETS)
        self.itl_hist = Histogram(ITL_BUCKETS)
        self.e2e = Histogram(E2E_BUCKETS)
        self.thread = None
        self.wedged = lambda: False
        self._frozen = None  # the exposition of the moment the engine wedged

    @classmethod
    def from_environment(cls, opts, facts, env):
        block = opts.get("block_size") or 16
        kv_tokens = int(
            env.get("GPUFLEET_LAB_VLLM_KV_TOKENS") or facts.get("blocks", 0) * block or facts.get("max_model_len", 2048)
        )
        return cls(
            kv_tokens=kv_tokens,
            block_size=block,
            max_num_seqs=facts.get("max_num_seqs") or 256,
            max_num_batched_tokens=facts.get("max_num_batched_tokens") or 2048,
            prefill_tps=float(env.get("GPUFLEET_LAB_VLLM_PREFILL_TPS", 20000)),
            itl=float(env.get("GPUFLEET_LAB_VLLM_ITL_S", 0.02)),
            itl_per_seq=float(env.get("GPUFLEET_LAB_VLLM_ITL_PER_SEQ_S", 0.0002)),
            frag_s_per_gib=float(env.get("GPUFLEET_LAB_VLLM_RSS_TTFT_S_PER_GIB", 2.0)),
        )

    # --- client side ----------------------------------------------------------------------------
    def submit(self, prompt_len, max_tokens):
        if self._blocks_for(prompt_len + 1) > self.total_blocks:
            raise EngineError(
                f"the request's {prompt_len} prompt tokens do not fit the KV pool "
                f"({self.total_blocks * self.block_size} tokens)"
            )
        req = Request(self, prompt_len, max(1, int(max_tokens)))
        with self.cond:
            self.waiting.append(req)
            self.cond.notify()
        return req

    def start(self):
        self.thread = threading.Thread(target=self._loop, name="engine-core", daemon=True)
        self.thread.start()

    # --- scheduling -----------------------------------------------------------------------------
    def _blocks_for(self, tokens):
        return math.ceil(tokens / self.block_size)

    def _free(self, req):
        self.used_blocks -= req.blocks
        req.blocks = 0

    def _preempt_newest(self):
        victim = max(self.running, key=lambda r: r.admitted_at)
        self.running.remove(victim)
        self._free(victim)
        victim.prefilled = 0  # recomputation: prompt and generated tokens are prefilled again
        self.waiting.appendleft(victim)
        self.preemptions += 1
        return victim

    def _schedule(self):
        """One step's plan under the lock: (decoders, [(request, prefill tokens)])."""
        for req in [r for r in self.running if r.aborted]:
            self.running.remove(req)
            self._free(req)
        decoders = []
        for req in sorted(self.running, key=lambda r: r.admitted_at):
            if req not in self.running or req.prefilled < req.length:
                continue
            need = self._blocks_for(req.length + 1) - req.blocks
            while need > self.total_blocks - self.used_blocks and req in self.running:
                self._preempt_newest()
            if req in self.running:
                self.used_blocks += max(0, need)
                req.blocks += max(0, need)
                decoders.append(req)
        budget = self.budget - len(decoders)
        prefills = []
        for req in self.running:  # chunked prefills still in progress
            if req.prefilled < req.length and budget > 0:
                chunk = min(budget, req.length - req.prefilled)
                prefills.append((req, chunk))
                budget -= chunk
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            req = self.waiting[0]
            if req.aborted:
                self.waiting.popleft()
                continue
            need = self._blocks_for(req.length + 1)
            if need > self.total_blocks - self.used_blocks:
                break
            self.waiting.popleft()
            self.used_blocks += need
            req.blocks = need
            req.admitted_at = time.monotonic()
            self.running.append(req)
            chunk = min(budget, req.length)
            prefills.append((req, chunk))
            budget -= chunk
        return decoders, prefills

    def _loop(self):
        words = itertools.cycle(WORDS)
        while True:
            if self.wedged():
                time.sleep(0.2)
                continue
            with self.cond:
                while not self.waiting and not self.running:
                    self.cond.wait(timeout=0.5)
                    if self.wedged():
                        break
                if not self.waiting and not self.running:
                    continue
                decoders, prefills = self._schedule()
            prefill_tokens = sum(c for _r, c in prefills)
            step = self.itl + self.itl_per_seq * len(decoders) + prefill_tokens / self.prefill_tps
            if prefills:
                step += self.frag_s_per_gib * self.leaked_bytes / GiB
            time.sleep(step)
            now = time.monotonic()
            with self.cond:
                emitted = []
                for req, chunk in prefills:
                    if req not in self.running:
                        continue
                    req.prefilled += chunk
                    if req.prefilled >= req.length:
                        if req.first_token is None:
                            self.prompt_total += req.prompt_len
                        emitted.append(req)
                emitted += [r for r in decoders if r in self.running]
                for req in emitted:
                    req.generated += 1
                    req.prefilled = req.length
                    self.generation_total += 1
                    if req.first_token is None:
                        req.first_token = now
                        self.ttft.observe(now - req.arrival)
                    else:
                        self.itl_hist.observe(now - req.last_token)
                    req.last_token = now
                    req.out.put(next(words))
                    if req.generated >= req.max_tokens or req.aborted:
                        self.running.remove(req)
                        self._free(req)
                        self.success += 1
                        self.e2e.observe(now - req.arrival)
                        req.done = True
                        req.out.put(None)

    # --- exposition -----------------------------------------------------------------------------
    def metrics(self, served):
        if not self.wedged():
            self._frozen = None
            return self._exposition(served)
        if self._frozen is None:
            self._frozen = self._exposition(served)
        return self._frozen

    def _exposition(self, served):
        labels = f'engine="0",model_name="{served}"'
        with self.cond:
            gauges = (
                (
                    "vllm:num_requests_running",
                    "gauge",
                    "Number of requests in model execution batches.",
                    float(len(self.running)),
                ),
                (
                    "vllm:num_requests_waiting",
                    "gauge",
                    "Number of requests waiting to be processed.",
                    float(len(self.waiting)),
                ),
                (
                    "vllm:kv_cache_usage_perc",
                    "gauge",
                    "KV-cache usage. 1 means 100 percent usage.",
                    self.used_blocks / self.total_blocks,
                ),
                (
                    "vllm:num_preemptions_total",
                    "counter",
                    "Cumulative number of preemption from the engine.",
                    float(self.preemptions),
                ),
                (
                    "vllm:prompt_tokens_total",
                    "counter",
                    "Number of prefill tokens processed.",
                    float(self.prompt_total),
                ),
                (
                    "vllm:generation_tokens_total",
                    "counter",
                    "Number of generation tokens processed.",
                    float(self.generation_total),
                ),
            )
            lines = []
            for name, kind, helptext, value in gauges:
                lines += [f"# HELP {name} {helptext}", f"# TYPE {name} {kind}", f"{name}{{{labels}}} {value}"]
            lines += [
                "# HELP vllm:request_success_total Count of successfully processed requests.",
                "# TYPE vllm:request_success_total counter",
                f'vllm:request_success_total{{{labels},finished_reason="length"}} {float(self.success)}',
            ]
            for name, helptext, hist in (
                ("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", self.ttft),
                ("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", self.itl_hist),
                ("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", self.e2e),
            ):
                lines += [f"# HELP {name} {helptext}", f"# TYPE {name} histogram"] + hist.lines(name, labels)
        return "\n".join(lines) + "\n"


class RSSLeak:
    """Resident memory that grows steadily (GPUFLEET_LAB_VLLM_RSS_GROWTH_MIB_S), as a worker whose
    allocator fragments does; the engine's prefill slows with it (fragmentation)."""

    def __init__(self, mib_per_s, engine=None, tick=0.25):
        self.rate = float(mib_per_s) * MiB
        self.engine = engine
        self.tick = tick
        self.chunks = []

    @classmethod
    def from_environment(cls, env, engine=None):
        rate = float(env.get("GPUFLEET_LAB_VLLM_RSS_GROWTH_MIB_S") or 0)
        return cls(rate, engine) if rate > 0 else None

    def start(self):
        threading.Thread(target=self._loop, name="rss-leak", daemon=True).start()

    def _loop(self):
        carry = 0.0
        while True:
            time.sleep(self.tick)
            carry += self.rate * self.tick
            size = int(carry)
            if size >= 4096:
                self.chunks.append(b"\x5a" * size)  # written bytes: resident, unlike calloc'd ones
                carry -= size
                if self.engine is not None:
                    self.engine.leaked_bytes += size
