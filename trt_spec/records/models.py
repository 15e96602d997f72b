"""A model's facts as preflight reads them from its config.json (builder/model_info.py reads them)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True)
class ModelInfo:
    architecture: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    tie_word_embeddings: bool
    max_position_embeddings: int
    num_experts: int = 1
    bos_token_id: Optional[int] = None
    eos_token_ids: tuple[int, ...] = ()
    source: str = "checkpoint"
    kv_latent_dim: int = 0  # multi-head latent attention: cached elements per token and layer, K and V in one

    def param_counts(self) -> tuple[int, int]:
        """(parameters in quantizable linear layers, parameters in embedding + LM head)."""
        h, layers = self.hidden_size, self.num_layers
        q = self.num_heads * self.head_dim
        kv = self.num_kv_heads * self.head_dim
        attn = h * q + 2 * h * kv + q * h
        mlp = 3 * h * self.intermediate_size * self.num_experts
        linear = layers * (attn + mlp)
        embed = self.vocab_size * h * (1 if self.tie_word_embeddings else 2)
        return linear, embed + (2 * layers + 1) * h

    @property
    def num_params(self) -> int:
        return sum(self.param_counts())
