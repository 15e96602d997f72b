"""The stand-in's GPU-numerics mode: a verification forward that is not bit-identical to a decode step.

On a GPU the target verifies draft tokens in the context phase (FP8 context FMHA, other GEMM shapes) while the baseline
decodes the same positions one at a time, so two tokens whose logits differ by less than the kernels' error swap places:
greedy outputs diverge at near-ties. The CPU reference engine computes both exactly alike. With this mode on, every
verification forward (the multi-token target forward that checks drafts: draft-target and n-gram rounds, an EAGLE
engine's in-engine steps) gets a seeded perturbation of its logits, uniform in [-margin/2, margin/2) per logit, so any
two logits move apart by less than `margin`: the verification's argmax differs from the decode's only where the
decode's top-2 margin is below `margin`. Decodes (the baseline, the draft, `trt-spec check`'s logits probe) stay exact.

On with GPU_NUMERICS_ENV="MARGIN[,SEED]" in the environment of the process that loads the engine models (tritonserver,
or bench in-process), or GpuNumerics passed to StandIn. Off (the default): greedy semantics are exact.
"""

from __future__ import annotations

import os
import zlib
from dataclasses import dataclass
from typing import Mapping, Optional, Sequence

import numpy as np
import torch

from ..records.defaults import GPU_NUMERICS_ENV, NEAR_TIE_MARGIN


@dataclass(frozen=True)
class GpuNumerics:
    margin: float = NEAR_TIE_MARGIN  # logits: no pairwise logit difference moves by this much or more
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.margin > 0:
            raise ValueError(f"{GPU_NUMERICS_ENV}: the margin must be > 0 logits, got {self.margin}")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> Optional["GpuNumerics"]:
        """GPU_NUMERICS_ENV="MARGIN[,SEED]" -> GpuNumerics; unset or empty -> None (exact numerics)."""
        raw = environ.get(GPU_NUMERICS_ENV, "").strip()
        if not raw:
            return None
        parts = raw.split(",")
        try:
            margin = float(parts[0])
            seed = int(parts[1]) if len(parts) > 1 else 0
        except ValueError:
            raise ValueError(
                f"{GPU_NUMERICS_ENV}={raw!r}: use MARGIN[,SEED], e.g. {NEAR_TIE_MARGIN} or {NEAR_TIE_MARGIN},7"
            ) from None
        if len(parts) > 2:
            raise ValueError(f"{GPU_NUMERICS_ENV}={raw!r}: use MARGIN[,SEED]")
        return cls(margin, seed)

    def perturb(self, logits: torch.Tensor, context: Sequence[int]) -> torch.Tensor:
        """logits [n, V] of one verification whose fed sequence is `context` (prompt + drafts) -> perturbed logits.
        Deterministic in (seed, context): the same verification flips the same way every time."""
        key = zlib.crc32(np.asarray(list(context), dtype=np.int64).tobytes(), self.seed & 0xFFFFFFFF)
        g = torch.Generator().manual_seed(key)
        noise = (torch.rand(logits.shape, generator=g, dtype=torch.float32) - 0.5) * self.margin
        return logits + noise.to(logits.dtype)
