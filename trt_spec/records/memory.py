"""GPU memory maths for the build plan and the repository: per-GPU weights, KV cache and reserve, and overflow."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

from .defaults import DEFAULT_KV_FRACTION
from .models import ModelInfo

if TYPE_CHECKING:
    from .deployment import Limits

GIB = 1024**3

BYTES_PER_WEIGHT = {
    "fp8": 1.0,
    "int8_sq": 1.0,
    "int8_wo": 1.0,
    "int4_awq": 0.5,
    "int4_wo": 0.5,
    "bf16": 2.0,
    "fp16": 2.0,
    "fp32": 4.0,
}
BYTES_PER_KV = {"fp8": 1.0, "int8": 1.0, "none": 2.0}
# llmapi loads draft/head checkpoints as they are, and published ones are 16-bit
LLMAPI_SPEC_MODEL_WEIGHTS = "bf16"
# -- quantize.py's GPU memory (upstream-facts: modelopt-calibration-memory)
# quantize.py loads the 16-bit model with device_map="auto" (accelerate places whole modules on the GPUs, the rest on
# the host), then runs batch_size x calib_max_seq_length token batches through it under no_grad, one decoder layer's
# activations live at a time plus the logits; each quantizer keeps one float32 amax. The floor is what must be
# resident (below it the GPUs cannot hold the model: accelerate offloads); the ceiling adds per GPU what is not in
# torch's allocator or not placed by accelerate: the CUDA context + cuBLAS workspace, and one largest module's slack
# (placement by whole modules, ModelOpt's per-layer export buffers). Between the two, offload may or may not happen.
CUDA_CONTEXT_GIB = 1.0  # per GPU, outside torch's allocator (~0.5-0.7 GiB on Hopper); an upper estimate
AMAX_BYTES = 4  # one float32 per quantizer (per-tensor FP8/INT8 scales)


@dataclass(frozen=True)
class CalibrationPeak:
    """quantize.py's GPU memory for one model, GiB: floor (must be resident) and ceiling (with per-GPU headroom)."""

    weights_gib: float  # the 16-bit model
    activations_gib: float  # one calibration batch's live activations + logits
    amax_gib: float
    headroom_per_gpu_gib: float  # CUDA context + one largest module

    @property
    def floor_gib(self) -> float:
        return self.weights_gib + self.activations_gib + self.amax_gib

    def ceiling_gib(self, gpus: int) -> float:
        return self.floor_gib + gpus * self.headroom_per_gpu_gib

    def gpus_needed(self, gpu_gib: float) -> int:
        """The fewest GPUs of gpu_gib each whose memory holds the ceiling."""
        n = 1
        while self.ceiling_gib(n) > n * gpu_gib:
            n += 1
        return n


def calibration_peak(info: ModelInfo, batch: int, seq: int) -> CalibrationPeak:
    """What quantize.py holds on the GPUs for `info` at --batch_size batch and --calib_max_seq_length seq."""
    linear, embed = info.param_counts()
    tokens = batch * seq
    h, q = info.hidden_size, info.num_heads * info.head_dim
    # live in one decoder layer (bf16): ~4 residual-stream copies, q/k/v, the MLP's gate, up and their product (per
    # expert routed to: at most all), and eager attention's fp32 scores + probabilities; then bf16 logits and their
    # float32 upcast
    per_layer = tokens * (4 * h + q + 2 * info.num_kv_heads * info.head_dim + 3 * info.intermediate_size) * 2
    per_layer += batch * info.num_heads * seq * seq * 4 * 2
    logits = tokens * info.vocab_size * (2 + 4)
    # two quantizers (input, weight) per linear layer (7 per decoder layer) and two KV ones per layer
    amax = info.num_layers * (7 * 2 + 2) * max(1, info.num_experts) * AMAX_BYTES
    largest = max(info.vocab_size * h, linear // max(1, info.num_layers)) * 2  # embedding/LM head or one layer
    return CalibrationPeak(
        (linear + embed) * 2 / GIB, (per_layer + logits) / GIB, amax / GIB, CUDA_CONTEXT_GIB + largest / GIB
    )


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
    """KV-cache GiB for `batch` sequences of `seq` tokens (MLA models: the latent holds K and V in one)."""
    per_layer = info.kv_latent_dim or info.num_kv_heads * info.head_dim * 2
    return info.num_layers * per_layer * BYTES_PER_KV[kv] * batch * seq / GIB


def memory_rows(
    role: str,
    info: ModelInfo,
    weights: str,
    kv_cache: str,
    tp: int,
    pp: int,
    devices: list[int],
    limits: Limits,
    reserve_gib: float,
) -> list[MemoryRow]:
    """One row per GPU: its shard of the weights and of max_batch_size full sequences' KV cache."""
    w = _weights_gib(info, weights) / (tp * pp)
    kv = kv_cache_gib(info, kv_cache, limits.max_batch_size, limits.max_seq_len) / (tp * pp)
    return [MemoryRow(d, role, w, kv, reserve_gib) for d in devices]


SHARING_ROLES = ("draft", "baseline")  # engines whose KV cache is capped so the target can size its own


def shared_gpu_kv_fraction(memory: list[MemoryRow], gpu_gib: float) -> float:
    """The target's kv_cache_free_gpu_mem_fraction that leaves room for a draft on its GPU (rounded down to 0.05)."""
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


# -- The memory plan of a written repository


@dataclass(frozen=True)
class Instance:
    """One model's weights and KV cache loaded by a Triton model; the cache is a share of free memory (kv_fraction)
    or capped at kv_tokens."""

    model: str  # the Triton model
    role: str  # target | draft | baseline
    info: ModelInfo
    weights: str
    kv_cache: str
    tp: int
    pp: int
    devices: list[int]
    kv_fraction: Optional[float] = None
    kv_tokens: Optional[int] = None


def instance_rows(inst: Instance, limits: Limits, reserve_gib: float) -> list[MemoryRow]:
    """memory_rows of one instance, KV cache capped at kv_tokens if set."""
    rows = memory_rows(
        inst.role, inst.info, inst.weights, inst.kv_cache, inst.tp, inst.pp, inst.devices, limits, reserve_gib
    )
    if inst.kv_tokens is None:
        return rows
    kv = kv_cache_gib(inst.info, inst.kv_cache, 1, inst.kv_tokens) / (inst.tp * inst.pp)
    return [MemoryRow(r.gpu_id, r.role, r.weights_gib, min(r.kv_gib, kv), r.reserve_gib) for r in rows]


def concurrent_sets(
    models: list[str], load_models: list[str], phase_models: dict[str, list[str]]
) -> dict[str, list[str]]:
    """The sets of models Triton holds at once: the launch set, and per phase model the set it swaps into."""
    launch = list(load_models) or [m for m in models if m not in phase_models]
    out = {"launch": launch}
    for phase, replaces in phase_models.items():
        out[f"phase {phase}"] = [m for m in launch if m not in replaces] + [phase]
    return out


def repository_overflow(
    instances: list[Instance],
    sets: dict[str, list[str]],
    limits: Limits,
    reserve_gib: float,
    gpu_name: str,
    gpu_gib: float,
    gpu_count: int,
) -> Optional[str]:
    """One line naming the first GPU a set of concurrently loaded models overflows, else None.

    Two models sizing their KV cache by share on one GPU cannot both fit: whichever loads second runs out."""
    for what, names in sets.items():
        live = [i for i in instances if i.model in names]
        for i in live:
            if i.devices and max(i.devices) >= gpu_count:
                return (
                    f"{i.model}: GPU ids {i.devices} need {max(i.devices) + 1} GPUs but the plan has {gpu_count} "
                    f"{gpu_name}; regenerate the repository for this node"
                )
        rows = {id(i): instance_rows(i, limits, reserve_gib) for i in live}
        for gid in sorted({d for i in live for d in i.devices}):
            here = [(i, [r for r in rows[id(i)] if r.gpu_id == gid]) for i in live if gid in i.devices]
            total = sum(r.total_gib for _, rs in here for r in rs)
            loaded = ", ".join(dict.fromkeys(i.model for i, _ in here))
            if total > gpu_gib:
                parts = ", ".join(f"{i.model} ({i.role}) {sum(r.total_gib for r in rs):.1f}" for i, rs in here)
                return (
                    f"GPU {gid} ({gpu_name}, {gpu_gib:.1f} GiB) would hold {total:.1f} GiB at {what} ({parts} GiB: "
                    "weights + KV cache for max_batch_size full sequences + reserve); lower limits.max_batch_size "
                    "or limits.max_seq_len, raise tp, or use an FP8 KV cache"
                )
            share = {i.model: i.kv_fraction for i, _ in here if i.kv_fraction is not None and i.kv_tokens is None}
            if len(share) > 1:
                a, b = list(share)[:2]
                return (
                    f"GPU {gid}: {a} and {b} are loaded together ({what}) and each sizes its KV cache as a share of "
                    f"the free memory ({share[a]}, {share[b]}), so whichever loads second runs out of memory; load "
                    "one of them for its phase only (trt-spec repo does for runtime llmapi), put them on other GPUs, "
                    "or cap one with max_tokens_in_paged_kv_cache"
                )
            if len(share) == 1:
                ((m, f),) = share.items()
                own = [r for i, rs in here if i.model == m for r in rs]
                others = sum(r.total_gib for i, rs in here if i.model != m for r in rs)
                left = (1 - f) * (gpu_gib - sum(r.weights_gib + r.reserve_gib for r in own))
                if others > left + 1e-9:
                    return (
                        f"GPU {gid}: {m} takes {f} of the free memory for its KV cache and leaves {left:.1f} GiB, "
                        f"less than the {others:.1f} GiB the other models on it ({loaded}) need at {what}; lower "
                        "runtime.kv_cache_free_gpu_mem_fraction or move the draft to another GPU"
                    )
    return None
