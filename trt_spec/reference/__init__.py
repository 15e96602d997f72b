"""CPU reference engine: a lean PyTorch decoder runtime and speculative decoding (imports torch)."""

from .model import KVCache, ModelConfig, ReferenceModel
from .ngram import NgramDraft
from .sampling import logits_to_probs, select
from .speculative import (
    GenerationResult,
    SpecMetrics,
    generate,
    speculative_accept,
    speculative_accept_batch,
)

__all__ = [
    "GenerationResult",
    "KVCache",
    "ModelConfig",
    "NgramDraft",
    "ReferenceModel",
    "SpecMetrics",
    "generate",
    "logits_to_probs",
    "select",
    "speculative_accept",
    "speculative_accept_batch",
]
