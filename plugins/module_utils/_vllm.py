# -*- coding: utf-8 -*-
# SPDX-License-Identifier: GPL-3.0-or-later
"""vLLM serving knowledge: the pinned release, its removed settings, hardware profiles, the
``vllm serve --config`` file, and the runtime environment (allocator and NCCL) GPU services read.

Plain Python, no Ansible. The filters in ``plugins/filter/kvplan.py`` expose it to the roles
``vllm_server`` and ``gpu_runtime_env``; the lab's vLLM stand-in reads the same settings.
"""

from __future__ import annotations

import math
import re

from ansible_collections.gpufleet.node.plugins.module_utils import _kvplan

VLLM_VERSION = '0.33.0'
VLLM_IMAGE = 'vllm/vllm-openai:v0.33.0'

# Settings older guides (and the seed documents) still use, that vLLM 0.33.0 no longer has, with
# what replaced them. Keys are the long flag names with underscores.
REMOVED_SETTINGS = {
    'swap_space': 'removed: the V1 engine never swaps KV blocks to CPU memory, it preempts and '
                  'recomputes; size the KV pool with gpu_memory_utilization or kv_cache_memory_bytes '
                  'and cap max_num_seqs instead (CPU offload, if wanted, is kv_offloading_size)',
    'calculate_kv_scales': 'removed (July 2026): fp8 KV-cache scales come from the checkpoint; use '
                           'kv_cache_dtype fp8 with a checkpoint that carries calibrated k/v scales',
    'disable_log_requests': 'replaced by enable_log_requests (request logging is off by default); '
                            'drop the setting, or set enable_log_requests: true to log requests',
    'num_scheduler_steps': 'removed with the V0 engine (multi-step scheduling); V1 schedules every step, '
                           'drop the setting',
    'use_v2_block_manager': 'removed with the V0 engine; drop the setting',
    'preemption_mode': 'removed: V1 always preempts by recomputation; drop the setting',
    'max_seq_len_to_capture': 'removed: CUDA-graph sizes are set with compilation_config '
                              '(cudagraph_capture_sizes / max_cudagraph_capture_size)',
}

# Per-hardware profiles. memory_mib is nvidia-smi's memory.total for the card; fp8_kv is whether
# vLLM's default attention backend there takes an fp8 KV cache (Ada and Hopper: yes).
HARDWARE_PROFILES = {
    'L40S': {'name': 'NVIDIA L40S', 'memory_mib': 46068, 'arch': 'ada', 'fp8_kv': True,
             'gpu_memory_utilization': 0.90, 'max_num_batched_tokens': 4096, 'max_num_seqs_cap': 256},
    'A100-80GB': {'name': 'NVIDIA A100-SXM4-80GB', 'other_names': ['NVIDIA A100 80GB PCIe'], 'memory_mib': 81920, 'arch': 'ampere', 'fp8_kv': False,
                  'gpu_memory_utilization': 0.92, 'max_num_batched_tokens': 8192, 'max_num_seqs_cap': 512},
    'H100-80GB': {'name': 'NVIDIA H100 80GB HBM3', 'memory_mib': 81559, 'arch': 'hopper', 'fp8_kv': True,
                  'gpu_memory_utilization': 0.92, 'max_num_batched_tokens': 8192, 'max_num_seqs_cap': 512},
    'H200': {'name': 'NVIDIA H200', 'memory_mib': 143771, 'arch': 'hopper', 'fp8_kv': True,
             'gpu_memory_utilization': 0.92, 'max_num_batched_tokens': 8192, 'max_num_seqs_cap': 1024},
    'RTX-A6000': {'name': 'NVIDIA RTX A6000', 'memory_mib': 49140, 'arch': 'ampere', 'fp8_kv': False,
                  'gpu_memory_utilization': 0.90, 'max_num_batched_tokens': 4096, 'max_num_seqs_cap': 256},
    'RTX-4090': {'name': 'NVIDIA GeForce RTX 4090', 'memory_mib': 24564, 'arch': 'ada', 'fp8_kv': True,
                 'gpu_memory_utilization': 0.90, 'max_num_batched_tokens': 2048, 'max_num_seqs_cap': 128},
}
HARDWARE_ALIASES = {
    'A100': 'A100-80GB', 'A100 80GB': 'A100-80GB', 'H100': 'H100-80GB', 'H100 80GB': 'H100-80GB',
    'H200 141GB': 'H200', 'RTX A6000': 'RTX-A6000', 'A6000': 'RTX-A6000', 'RTX 4090': 'RTX-4090',
    '4090': 'RTX-4090', 'L40S 48GB': 'L40S',
}

# Per-model serving profiles. max_model_len is pinned from the expected prompt p99 plus the output
# budget (seed 001: p99 11k -> 16384), not left at the model's 128k default.
MODEL_SERVING = {
    'Llama-3.3-70B-Instruct': {'max_model_len': 16384, 'expected_request_len': 8192, 'kv_cache_dtype': 'auto'},
    'Llama-3.3-70B-Instruct-FP8': {'max_model_len': 16384, 'expected_request_len': 8192,
                                   'kv_cache_dtype': 'fp8'},
    'Llama-3.1-70B-Instruct': {'max_model_len': 16384, 'expected_request_len': 8192, 'kv_cache_dtype': 'auto'},
    'Llama-3.1-8B-Instruct': {'max_model_len': 16384, 'expected_request_len': 4096, 'kv_cache_dtype': 'auto'},
    'Qwen2.5-72B-Instruct': {'max_model_len': 16384, 'expected_request_len': 8192, 'kv_cache_dtype': 'auto'},
    'DeepSeek-V2-Lite-Chat': {'max_model_len': 16384, 'expected_request_len': 4096, 'kv_cache_dtype': 'auto',
                              'trust_remote_code': True},
}

# The config keys the role always writes, in this order.
CONFIG_KEYS = ('model', 'served_model_name', 'host', 'port', 'tensor_parallel_size', 'pipeline_parallel_size',
               'dtype', 'kv_cache_dtype', 'gpu_memory_utilization', 'max_model_len', 'block_size',
               'max_num_batched_tokens', 'max_num_seqs', 'enable_prefix_caching', 'shutdown_timeout')


class ServingError(ValueError):
    """A serving configuration that must be refused before anything is written."""


def norm_key(key):
    return str(key).strip().lstrip('-').replace('-', '_')


def removed_settings(config):
    """Messages for each removed setting in a config dict (keys with dashes or underscores)."""
    found = []
    for key in (config or {}):
        k = norm_key(key)
        if k in REMOVED_SETTINGS:
            found.append('%s: %s' % (key, REMOVED_SETTINGS[k]))
    return found


def hardware_profile(name):
    key = HARDWARE_ALIASES.get(name, name)
    if key not in HARDWARE_PROFILES:
        # an nvidia-smi product name such as "NVIDIA L40S"
        for pname, prof in HARDWARE_PROFILES.items():
            if str(name).lower() in [n.lower() for n in [prof['name']] + prof.get('other_names', [])]:
                return pname, dict(prof)
        raise ServingError('unknown GPU hardware profile %r; known: %s'
                           % (name, ', '.join(sorted(HARDWARE_PROFILES))))
    return key, dict(HARDWARE_PROFILES[key])


def default_tensor_parallel(arch, gpu_count):
    """The largest power of two <= gpu_count that divides the attention heads."""
    heads = int(arch.get('num_attention_heads') or 1)
    tp = 1
    while tp * 2 <= int(gpu_count) and heads % (tp * 2) == 0:
        tp *= 2
    return tp


def serve_config(model, gpu, gpu_count, overrides=None, host='127.0.0.1', port=8000, served_model_name=None,
                 gpu_memory_mib=None, oversubscription_factor=1.0, shutdown_timeout=30, reserves=None):
    """Build the ``vllm serve --config`` dict and the planner's arguments.

    ``overrides`` are the user's settings (keys with dashes or underscores); an override of ``auto`` or
    None keeps the derived value. Returns ``{'config': {...}, 'plan_args': {...},
    'expected_request_len': N}``. Raises :class:`ServingError` on removed settings.
    """
    gone = removed_settings(overrides)
    overrides = {norm_key(k): v for k, v in (overrides or {}).items()}
    if gone:
        raise ServingError('vLLM %s no longer has these settings: %s' % (VLLM_VERSION, '; '.join(gone)))
    name, arch = _kvplan.resolve_model(model)
    hw_name, hw = hardware_profile(gpu)
    serving = dict(MODEL_SERVING.get(name, {}))
    mem = int(gpu_memory_mib or hw['memory_mib'])

    def pick(key, derived):
        value = overrides.get(key)
        return derived if value in (None, '', 'auto') or (key != 'kv_cache_dtype' and value == 'auto') else value

    tp = int(pick('tensor_parallel_size', default_tensor_parallel(arch, gpu_count)))
    pp = int(pick('pipeline_parallel_size', 1))
    if tp * pp > int(gpu_count):
        raise ServingError('tensor_parallel_size %d x pipeline_parallel_size %d needs %d GPUs, the node has %d'
                           % (tp, pp, tp * pp, int(gpu_count)))
    kv_dtype = serving.get('kv_cache_dtype', 'auto')
    if kv_dtype.startswith('fp8') and not hw['fp8_kv']:
        kv_dtype = 'auto'
    kv_dtype = pick('kv_cache_dtype', kv_dtype)
    max_model_len = int(pick('max_model_len', serving.get('max_model_len') or
                             min(int(arch.get('max_position_embeddings') or 8192), 16384)))
    expected = int(pick('expected_request_len', serving.get('expected_request_len') or max_model_len // 2))
    block_size = int(pick('block_size', 16))
    mnbt = int(pick('max_num_batched_tokens', hw['max_num_batched_tokens']))
    util = float(pick('gpu_memory_utilization', hw['gpu_memory_utilization']))
    dtype = pick('dtype', _kvplan.model_dtype(arch))
    reserves = dict(reserves or {})

    plan_args = dict(model=model if isinstance(model, dict) else name, gpu_memory_mib=mem,
                     tensor_parallel_size=tp, pipeline_parallel_size=pp, gpu_memory_utilization=util,
                     kv_cache_dtype=kv_dtype, dtype=dtype, max_model_len=max_model_len,
                     max_num_batched_tokens=mnbt, block_size=block_size, expected_request_len=expected,
                     oversubscription_factor=float(oversubscription_factor),
                     enforce_eager=bool(overrides.get('enforce_eager', False)))
    if overrides.get('kv_cache_memory_bytes'):
        plan_args['kv_cache_memory_bytes'] = int(overrides['kv_cache_memory_bytes'])
    for key in ('activation_bytes', 'cuda_graph_bytes', 'non_torch_bytes'):
        if reserves.get(key) is not None:
            plan_args[key] = int(reserves[key])

    seqs = overrides.get('max_num_seqs')
    if seqs in (None, '', 'auto'):
        # as many sequences of the expected length as the pool holds, within the hardware's cap
        probe = _kvplan.plan(max_num_seqs=hw['max_num_seqs_cap'], **plan_args)
        fit = int(probe['kv_capacity_blocks'] * block_size * float(oversubscription_factor) // expected)
        seqs = max(1, min(hw['max_num_seqs_cap'], fit))
    plan_args['max_num_seqs'] = int(seqs)

    config = {
        'model': arch.get('hf_id') or name,
        'served_model_name': served_model_name or name,
        'host': host,
        'port': int(port),
        'tensor_parallel_size': tp,
        'pipeline_parallel_size': pp,
        'dtype': dtype,
        'kv_cache_dtype': kv_dtype,
        'gpu_memory_utilization': util,
        'max_model_len': max_model_len,
        'block_size': block_size,
        'max_num_batched_tokens': mnbt,
        'max_num_seqs': int(seqs),
        'enable_prefix_caching': bool(pick('enable_prefix_caching', True)),
        'shutdown_timeout': int(pick('shutdown_timeout', shutdown_timeout)),
    }
    if serving.get('trust_remote_code'):
        config['trust_remote_code'] = True
    for key, value in overrides.items():
        if key in ('expected_request_len',) or key in config and value in (None, '', 'auto'):
            continue
        if value is None:
            continue
        config[key] = value
    if 'kv_cache_memory_bytes' in config:
        config.pop('gpu_memory_utilization', None)
    return {'config': config, 'plan_args': plan_args, 'expected_request_len': expected,
            'hardware': hw_name, 'model': name}


# --- runtime environment ----------------------------------------------------------------------

# NCCL_P2P_LEVEL values, narrowest first. NODE and SYS cross host bridges or the CPU interconnect:
# the derived level never opens P2P across them (set it yourself if you measured that it helps).
_PCIE_ORDER = ('PIX', 'PXB', 'PHB')
_ENV_NAME = re.compile(r'^[A-Za-z_][A-Za-z0-9_]*$')


def _is_rdma_nic(nic):
    if isinstance(nic, dict):
        if 'rdma' in nic:
            return bool(nic['rdma'])
        cls = str(nic.get('class', nic.get('class_id', ''))).lower().replace('0x', '')
        vendor = str(nic.get('vendor', nic.get('vendor_id', ''))).lower().replace('0x', '')
        if cls.startswith('0207'):
            return True
        if cls.startswith('0200') and vendor == '15b3':
            return True
        if cls or vendor:
            driver = str(nic.get('driver') or '')
            return driver.startswith('mlx5') or driver in ('irdma', 'bnxt_re', 'efa')
    # pcie_acs_info lists only RDMA NICs in `nics`: an entry without class data is one
    return True


def p2p_level(links):
    """NCCL_P2P_LEVEL for a GPU links matrix ``{"GPU0": {"GPU1": "PIX"}}``; None when NCCL should decide.

    All pairs on NVLink: ``NVL``. Otherwise the widest PCIe path (PIX < PXB < PHB) that some pair needs,
    so every pair under one CPU's host bridge may use P2P; pairs across NODE/SYS do not raise it.
    """
    pairs = []
    for a, row in (links or {}).items():
        for b, kind in (row or {}).items():
            if a == b or str(kind).upper() in ('X', ''):
                continue
            pairs.append(str(kind).upper())
    if not pairs:
        return None
    if all(k.startswith('NV') for k in pairs):
        return 'NVL'
    pcie = [k for k in pairs if k in _PCIE_ORDER]
    if not pcie:
        return None
    return max(pcie, key=_PCIE_ORDER.index)


def runtime_env(topology=None, nics=None, rdma='auto', nccl_debug=None, user_env=None,
                alloc_conf='expandable_segments:True'):
    """The env for GPU services. Returns ``{'env': {...}, 'why': {...}, 'warnings': [...]}``.

    User values (``user_env``) always win; a user value of None removes a derived variable.
    """
    env, why, warnings = {}, {}, []
    if alloc_conf:
        env['PYTORCH_CUDA_ALLOC_CONF'] = alloc_conf
        why['PYTORCH_CUDA_ALLOC_CONF'] = ('expandable segments against fragmentation; vLLM turns them off '
                                          'while its memory pool is active and drops other options')
    gpus = (topology or {}).get('gpus') or []
    level = p2p_level((topology or {}).get('links'))
    if level:
        env['NCCL_P2P_LEVEL'] = level
        why['NCCL_P2P_LEVEL'] = 'widest GPU-to-GPU link under one host bridge in the measured topology'
    has_rdma = None
    if rdma in (True, False):
        has_rdma = rdma
    elif str(rdma).lower() in ('true', 'yes', '1'):
        has_rdma = True
    elif str(rdma).lower() in ('false', 'no', '0'):
        has_rdma = False
    elif nics is not None:
        has_rdma = any(_is_rdma_nic(n) for n in nics)
    if has_rdma is False and (len(gpus) != 1):
        env['NCCL_IB_DISABLE'] = '1'
        why['NCCL_IB_DISABLE'] = 'the node has no RDMA NIC'
    if nccl_debug:
        env['NCCL_DEBUG'] = str(nccl_debug).upper()
        why['NCCL_DEBUG'] = 'asked for (debugging)'
    for key, value in (user_env or {}).items():
        if not _ENV_NAME.match(str(key)):
            raise ServingError('invalid environment variable name %r' % key)
        if value is None:
            env.pop(key, None)
            why.pop(key, None)
            continue
        value = str(value).lower() if isinstance(value, bool) else str(value)
        env[key] = value
        why[key] = 'set by the user'
    for key, value in env.items():
        if any(c in value for c in '\n\r"\'\\') or value != value.strip():
            raise ServingError('%s=%r cannot be written to an env file read by both systemd and docker '
                               '(no quotes, backslashes, newlines or surrounding spaces)' % (key, value))
    alloc = env.get('PYTORCH_CUDA_ALLOC_CONF', '')
    extra = [o for o in alloc.split(',') if o and not o.startswith('expandable_segments')]
    if extra:
        warnings.append('PYTORCH_CUDA_ALLOC_CONF options %s do not survive vLLM\'s memory pool (it keeps only '
                        'expandable_segments)' % ','.join(extra))
    return {'env': env, 'why': why, 'warnings': warnings}


def parse_env_file(text):
    """KEY=value lines (systemd EnvironmentFile / docker --env-file); comments and blanks skipped."""
    env = {}
    for num, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith('#'):
            continue
        key, sep, value = line.partition('=')
        if not sep or not _ENV_NAME.match(key):
            raise ValueError('line %d is not KEY=value: %r' % (num, line))
        env[key] = value
    return env


def stop_timeout(shutdown_timeout, margin=60):
    """systemd TimeoutStopSec above vLLM's drain window plus its worker shutdown window (5 s)."""
    return int(math.ceil(float(shutdown_timeout))) + 5 + int(margin)
