"""The memory plan: what each GPU holds (weights, KV cache, reserve) for a target/draft pair, and the KV-cache
share of free memory the target may take when the draft shares its GPU.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..records.config import BuildConfig
from .model_info import ModelInfo
from .trtllm import DEFAULT_KV_FRACTION

GIB = 1024**3

BYTES_PER_WEIGHT = {"fp8": 1.0, "int8_sq": 1.0, "int8_wo": 1.0, "int4_awq": 0.5, "int4_wo": 0.5,
                    "bf16": 2.0, "fp16": 2.0, "fp32": 4.0}
BYTES_PER_KV = {"fp8": 1.0, "int8": 1.0, "none": 2.0}
# FP8 calibration of a 70B model peaks above 210 GB: ~1.6x its 16-bit weights.
CALIBRATION_PEAK_FACTOR = 1.6


@dataclass(frozen=True)
class MemoryRow:
    gpu_id: int
    role: str  # target | draft | baseline
    weights_gib: float
    kv_gib: float
    reserve_gib: float

    @property
    def total_gib(self) -> float:
        return self.weights_gib + self.kv_gib + self.reserve_gib


def totals_per_gpu(rows: list[MemoryRow]) -> dict[int, float]:
    out: dict[int, float] = {}
    for r in rows:
        out[r.gpu_id] = out.get(r.gpu_id, 0.0) + r.total_gib
    return out


def _weights_gib(info: ModelInfo, weights: str) -> float:
    linear, embed = info.param_counts()
    # ModelOpt quantizes the linear layers; embeddings, norms and the LM head stay 16-bit.
    embed_bytes = 4.0 if weights == "fp32" else 2.0
    return (linear * BYTES_PER_WEIGHT[weights] + embed * embed_bytes) / GIB


def kv_cache_gib(info: ModelInfo, kv: str, batch: int, seq: int) -> float:
    """layers x kv_heads x head_dim x 2 (K and V) x bytes x max_batch_size x max_seq_len; with multi-head latent
    attention, layers x the latent (K and V in one) instead."""
    per_layer = info.kv_latent_dim or info.num_kv_heads * info.head_dim * 2
    return info.num_layers * per_layer * BYTES_PER_KV[kv] * batch * seq / GIB


def memory_rows(role: str, info: ModelInfo, weights: str, kv_cache: str, tp: int, pp: int, devices: list[int],
                cfg: BuildConfig) -> list[MemoryRow]:
    """One row per GPU of the role: its shard of the weights and KV cache (max_batch_size full sequences)."""
    w = _weights_gib(info, weights) / (tp * pp)
    kv = kv_cache_gib(info, kv_cache, cfg.limits.max_batch_size, cfg.limits.max_seq_len) / (tp * pp)
    return [MemoryRow(d, role, w, kv, cfg.serving.memory_reserve_gib) for d in devices]


SHARING_ROLES = ("draft", "baseline")  # engines whose KV cache is capped so the target can size its own


def shared_gpu_kv_fraction(memory: list[MemoryRow], gpu_gib: float) -> float:
    """Target kv_cache_free_gpu_mem_fraction on a GPU shared with the draft: the share of the memory left after
    the target's weights and reserve that still leaves the draft's weights, capped KV cache and reserve free
    (rounded down to 0.05; the executor's default 0.9 at most)."""
    fracs = []
    for gid in {r.gpu_id for r in memory if r.role in SHARING_ROLES}:
        t = [r for r in memory if r.gpu_id == gid and r.role == "target"]
        d = sum(r.total_gib for r in memory if r.gpu_id == gid and r.role in SHARING_ROLES)
        if not t:
            continue
        free = gpu_gib - t[0].weights_gib - t[0].reserve_gib
        fracs.append((free - d) / free if free > 0 else 0.0)
    f = min(fracs, default=DEFAULT_KV_FRACTION)
    return round(max(0.05, min(DEFAULT_KV_FRACTION, math.floor(f * 20) / 20)), 2)
