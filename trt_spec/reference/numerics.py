"""The stand-in's GPU-numerics mode: verification logits get seeded noise in [-margin/2, margin/2), decodes stay exact.

A GPU verifies drafts with other kernels than decode, so near-tie tokens can swap; this imitates it on CPU. On with
GPU_NUMERICS_ENV="MARGIN[,SEED]" in the loading process, or GpuNumerics passed to StandIn.
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
    margin: float = NEAR_TIE_MARGIN  # logits
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.margin > 0:
            raise ValueError(f"{GPU_NUMERICS_ENV}: the margin must be > 0 logits, got {self.margin}")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> Optional["GpuNumerics"]:
        """GPU_NUMERICS_ENV="MARGIN[,SEED]" -> GpuNumerics; unset -> None."""
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
        """Perturbed verification logits [n, V], deterministic in (seed, context)."""
        key = zlib.crc32(np.asarray(list(context), dtype=np.int64).tobytes(), self.seed & 0xFFFFFFFF)
        g = torch.Generator().manual_seed(key)
        noise = (torch.rand(logits.shape, generator=g, dtype=torch.float32) - 0.5) * self.margin
        return logits + noise.to(logits.dtype)
