"""The stand-in's GPU-numerics mode: context-phase logits get seeded noise in [-margin/2, margin/2), one-token
decode steps stay exact.

On a GPU a request's first forward (a prompt's prefill, a teacher-forced probe, a draft-target verification, which the
BLS sends as a new request) runs the context-phase kernels (FP8 context FMHA); a step feeding several tokens (an
in-engine draft verification) runs multi-token attention too, counted with them; a one-token decode step runs the
generation kernels. Their logits differ, so near-tie tokens can swap between the two paths. `context_phase` is the one
rule for which steps are perturbed. The row that predicts position p gets noise keyed on (seed, tokens[:p]), so every
context-phase forward gives a position the same logits, as the same kernels would: a probe sees exactly what a
verification saw, and check's noise floor (generation rows vs a context-phase probe) measures the noise. On with
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


def context_phase(first_step: bool, fed: int) -> bool:
    """Whether a request's forward step runs the context-phase kernels: its first step (whatever its length, a
    prefix-cache hit feeding one token included) or any step feeding more than one token."""
    return first_step or fed > 1


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

    def perturb(self, logits: torch.Tensor, tokens: Sequence[int]) -> torch.Tensor:
        """Logits [n, V] of the last n positions of `tokens` (every token fed so far), perturbed: row i predicts
        position p = len(tokens) - n + 1 + i, and its noise depends on (seed, tokens[:p]) only."""
        n = logits.shape[0]
        ids = np.asarray(list(tokens), dtype=np.int64)
        first = len(ids) - n + 1
        if first < 1:
            raise ValueError(f"{n} logits rows need at least {n} tokens fed, got {len(ids)}")
        key = zlib.crc32(ids[:first].tobytes(), self.seed & 0xFFFFFFFF)
        noise = torch.empty(logits.shape, dtype=torch.float32)
        for i in range(n):
            if i:  # crc32 runs on: the key of tokens[:p + 1] extends that of tokens[:p]
                key = zlib.crc32(ids[first + i - 1 : first + i].tobytes(), key)
            noise[i] = torch.rand(logits.shape[1:], generator=torch.Generator().manual_seed(key))
        return logits + ((noise - 0.5) * self.margin).to(logits.dtype)
