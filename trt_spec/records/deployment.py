"""The deployment: everything a built config serves, resolved once by builder/preflight.py into the build manifest."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from . import defaults
from .models import ModelInfo
from .recipes import Recipe, recipe
from .speculation import CacheScope, Engine, Mode, Policy, Proposer, Runtime, as_words


@dataclass(frozen=True)
class SuffixCacheConfig:
    """The suffix proposer's cross-request cache (in_triton/proposers.py SuffixCacheConfig)."""

    scope: CacheScope = CacheScope(defaults.SUFFIX_CACHE_SCOPE)
    max_tokens: int = defaults.SUFFIX_CACHE_MAX_TOKENS
    max_sequences: int = defaults.SUFFIX_CACHE_MAX_SEQUENCES
    max_tenants: int = defaults.SUFFIX_CACHE_MAX_TENANTS
    min_match: int = defaults.SUFFIX_CACHE_MIN_MATCH

    def __post_init__(self):
        as_words(self)


@dataclass(frozen=True)
class Lookahead:
    window_size: int
    ngram_size: int
    verification_set_size: int


@dataclass(frozen=True)
class Speculation:
    """Every speculation knob, once, as served."""

    mode: Mode
    max_draft_len: int  # K built into the target engine
    num_draft_tokens: int  # the k of a request that names none
    ngram_size: int
    draft_len_policy: Policy
    proposer: Proposer
    use_draft_logits: bool = False
    suffix_cache: SuffixCacheConfig = SuffixCacheConfig()
    medusa_choices: Optional[list[list[int]]] = None
    eagle_choices: Optional[list[list[int]]] = None
    lookahead: Optional[Lookahead] = None
    eagle3_one_model: bool = True  # runtime llmapi eagle3: head and target in one model
    num_nextn_predict_layers: Optional[int] = None  # runtime llmapi mtp

    def __post_init__(self):
        as_words(self)


@dataclass(frozen=True)
class Limits:
    max_batch_size: int
    max_input_len: int
    max_seq_len: int
    max_num_tokens: int


@dataclass(frozen=True)
class WorldSize:
    target: int
    draft: int
    total: int


@dataclass(frozen=True)
class Placement:
    """Which GPUs hold which model, and how their KV caches are sized."""

    target_devices: list[int]
    draft_devices: list[int]
    kv_cache_free_gpu_mem_fraction: float
    draft_max_tokens_in_paged_kv_cache: Optional[int]  # caps the engine sharing the target's GPUs
    world_size: WorldSize
    memory_reserve_gib: float


@dataclass(frozen=True)
class Models:
    """The models' facts as preflight read them (None: no such model)."""

    target: ModelInfo
    draft: Optional[ModelInfo] = None
    head: Optional[ModelInfo] = None  # runtime llmapi eagle3: the EAGLE-3 head


@dataclass(frozen=True)
class Deployment:
    runtime: Runtime
    engine: Engine
    speculation: Speculation
    limits: Limits
    placement: Placement
    weights: str  # quantization of the weights (fp8, bf16, ...)
    kv_cache: str  # fp8 | int8 | none
    tokenizer_dir: str  # absolute, or pkg:NAME
    models: Models

    def __post_init__(self):
        as_words(self)

    @property
    def gpu(self) -> bool:
        return self.engine is Engine.TENSORRT

    @property
    def recipe(self) -> Recipe:
        return recipe(self.runtime, self.engine, self.speculation.mode)
