"""Preflight: every check that can fail a build, before any expensive step.

Each failure raises PreflightError with one line naming the problem and the fix. Checks that read
checkpoints work offline from config.json / tokenizer files only (no torch, no transformers).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from .config import BuildConfig
from .hardware import GpuSpec

GIB = 1024**3

# Architectures the TensorRT-LLM 1.2 engine flow (convert_checkpoint.py / quantize.py + trtllm-build) builds,
# mapped to the examples/models/core/<family> directory whose convert_checkpoint.py handles them.
TRTLLM_ARCHITECTURES: dict[str, str] = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "llama",
    "MixtralForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen",
    "GemmaForCausalLM": "gemma",
    "Gemma2ForCausalLM": "gemma",
    "Phi3ForCausalLM": "phi",
}
# The CPU reference engine implements the Llama-style decoder (Llama, SmolLM2, Qwen2).
REFERENCE_ARCHITECTURES = {"LlamaForCausalLM", "Qwen2ForCausalLM", "MistralForCausalLM"}

VOCAB_PAD_TOLERANCE = 128
FIRST_COMPARED_TOKEN_ID = 5
MEDUSA_DEFAULT_TREE_NODES = 63  # TRT-LLM's default tree (mc_sim_7b_63) has 63 nodes

BYTES_PER_WEIGHT = {"fp8": 1.0, "int8_sq": 1.0, "int8_wo": 1.0, "int4_awq": 0.5, "int4_wo": 0.5,
                    "bf16": 2.0, "fp16": 2.0, "fp32": 4.0}
BYTES_PER_KV = {"fp8": 1.0, "int8": 1.0, "none": 2.0}
DEFAULT_KV_FRACTION = 0.9  # the executor's default share of free memory for the KV cache
# FP8 calibration of a 70B model peaks above 210 GB: ~1.6x its 16-bit weights.
CALIBRATION_PEAK_FACTOR = 1.6
TOKENS_PER_BLOCK = 32  # KV-cache block size (trtllm-build --tokens_per_block): small blocks reuse more prefix
# Modes whose target is built with draft_tokens_external: the executor refuses such a target without KV-cache
# block reuse (trtGptModelInflightBatching.cpp), and reuse needs paged context FMHA, which tensorrt_llm/builder.py
# turns off with an INT8 KV cache, and with an FP8 KV cache unless the weights are FP8 on SM >= 89.
EXTERNAL_DRAFT_MODES = ("draft_target", "ngram")


class PreflightError(ValueError):
    """A check failed: one line naming the problem and the fix."""


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

    def param_counts(self) -> tuple[int, int]:
        """(parameters in quantizable linear layers, parameters in embedding + LM head)."""
        h, l = self.hidden_size, self.num_layers
        q = self.num_heads * self.head_dim
        kv = self.num_kv_heads * self.head_dim
        attn = h * q + 2 * h * kv + q * h
        mlp = 3 * h * self.intermediate_size * self.num_experts
        linear = l * (attn + mlp)
        embed = self.vocab_size * h * (1 if self.tie_word_embeddings else 2)
        return linear, embed + (2 * l + 1) * h

    @property
    def num_params(self) -> int:
        return sum(self.param_counts())


# Published config.json values of the models the shipped build configs name, so `trt-spec plan` can show a
# memory plan on a machine that does not hold the checkpoints. `trt-spec build` always reads the real files.
KNOWN_MODELS: dict[str, ModelInfo] = {
    "llama-3.3-70b-instruct": ModelInfo("LlamaForCausalLM", 80, 8192, 64, 8, 128, 28672, 128256, False, 131072,
                                        bos_token_id=128000, eos_token_ids=(128001, 128008, 128009)),
    "llama-3.1-8b-instruct": ModelInfo("LlamaForCausalLM", 32, 4096, 32, 8, 128, 14336, 128256, False, 131072,
                                       bos_token_id=128000, eos_token_ids=(128001, 128008, 128009)),
    "llama-3.2-1b-instruct": ModelInfo("LlamaForCausalLM", 16, 2048, 32, 8, 64, 8192, 128256, True, 131072,
                                       bos_token_id=128000, eos_token_ids=(128001, 128008, 128009)),
    "qwen2.5-coder-32b-instruct": ModelInfo("Qwen2ForCausalLM", 64, 5120, 40, 8, 128, 27648, 152064, False, 32768,
                                            bos_token_id=151643, eos_token_ids=(151645,)),
    "qwen2.5-coder-0.5b-instruct": ModelInfo("Qwen2ForCausalLM", 24, 896, 14, 2, 64, 4864, 151936, True, 32768,
                                             bos_token_id=151643, eos_token_ids=(151645,)),
    "smollm2-135m-instruct": ModelInfo("LlamaForCausalLM", 30, 576, 9, 3, 64, 1536, 49152, True, 8192,
                                       bos_token_id=1, eos_token_ids=(2,)),
    "vicuna-7b-v1.3": ModelInfo("LlamaForCausalLM", 32, 4096, 32, 32, 128, 11008, 32000, False, 2048,
                                bos_token_id=1, eos_token_ids=(2,)),
}


@dataclass(frozen=True)
class QuantChoice:
    weights: str  # one of BYTES_PER_WEIGHT
    kv_cache: str  # fp8 | int8 | none
    fell_back: bool = False

    @property
    def fp8_context_fmha(self) -> bool:
        """What tensorrt_llm/builder.py build() decides by itself (1.2): FP8 context FMHA is on with FP8 weights, an
        FP8 KV cache and paged context FMHA on SM >= 89 (an explicit `disable` is overridden), off otherwise."""
        return self.weights == "fp8" and self.kv_cache == "fp8"


@dataclass(frozen=True)
class MemoryRow:
    gpu_id: int
    role: str  # target | draft
    weights_gib: float
    kv_gib: float
    reserve_gib: float

    @property
    def total_gib(self) -> float:
        return self.weights_gib + self.kv_gib + self.reserve_gib


def _totals(rows: list[MemoryRow]) -> dict[int, float]:
    out: dict[int, float] = {}
    for r in rows:
        out[r.gpu_id] = out.get(r.gpu_id, 0.0) + r.total_gib
    return out


@dataclass
class PreflightReport:
    config: BuildConfig
    gpu: Optional[GpuSpec]
    target: ModelInfo
    draft: Optional[ModelInfo]
    quant: QuantChoice
    target_devices: list[int]
    draft_devices: list[int]
    kv_cache_free_gpu_mem_fraction: float
    max_draft_len: int
    draft_kv_tokens: Optional[int] = None  # max_tokens_in_paged_kv_cache for the draft
    memory: list[MemoryRow] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def shares_gpu(self) -> bool:
        return bool(set(self.target_devices) & set(self.draft_devices))

    def gpu_totals(self) -> dict[int, float]:
        return _totals(self.memory)

    def memory_table(self) -> str:
        if not self.memory:
            return "memory plan: not applicable (no GPU)"
        cap = self.gpu.memory_gib if self.gpu else float("nan")
        lines = [f"{'GPU':>3}  {'model':<6}  {'weights':>9}  {'KV cache':>9}  {'reserve':>8}  {'total':>8}"]
        for r in self.memory:
            lines.append(f"{r.gpu_id:>3}  {r.role:<6}  {r.weights_gib:>7.1f}Gi  {r.kv_gib:>7.1f}Gi  "
                         f"{r.reserve_gib:>6.1f}Gi  {r.total_gib:>6.1f}Gi")
        for gid, tot in sorted(self.gpu_totals().items()):
            lines.append(f"{gid:>3}  {'sum':<6}  {'':>9}  {'':>9}  {'':>8}  {tot:>6.1f}Gi of {cap:.1f}Gi")
        return "\n".join(lines)


# ---------------------------------------------------------------------------------------------------------
# Checkpoint reading


def _first(d: dict, *keys, default=None):
    for k in keys:
        if d.get(k) is not None:
            return d[k]
    return default


def read_model_info(checkpoint: Path, role: str) -> ModelInfo:
    cfg_path = checkpoint / "config.json"
    if not checkpoint.is_dir():
        raise PreflightError(f"{role}.checkpoint {checkpoint}: directory not found; download the Hugging Face "
                             f"checkpoint there or point {role}.checkpoint at it (--set {role}.checkpoint=DIR)")
    if not cfg_path.is_file():
        raise PreflightError(f"{role}.checkpoint {checkpoint}: no config.json; point {role}.checkpoint at a "
                             "Hugging Face model directory (the one with config.json and *.safetensors)")
    try:
        c = json.loads(cfg_path.read_text())
    except json.JSONDecodeError as e:
        raise PreflightError(f"{cfg_path}: invalid JSON ({e.msg} at line {e.lineno}); re-download the checkpoint") from None
    archs = c.get("architectures") or []
    if not archs:
        raise PreflightError(f"{cfg_path}: no 'architectures' entry; this is not a causal-LM checkpoint")
    try:
        hidden = int(c["hidden_size"])
        heads = int(c["num_attention_heads"])
        eos = c.get("eos_token_id")
        return ModelInfo(
            architecture=archs[0],
            num_layers=int(c["num_hidden_layers"]),
            hidden_size=hidden,
            num_heads=heads,
            num_kv_heads=int(_first(c, "num_key_value_heads", default=heads)),
            head_dim=int(_first(c, "head_dim", default=hidden // heads)),
            intermediate_size=int(c["intermediate_size"]),
            vocab_size=int(c["vocab_size"]),
            tie_word_embeddings=bool(c.get("tie_word_embeddings", False)),
            max_position_embeddings=int(_first(c, "max_position_embeddings", default=0)),
            num_experts=int(_first(c, "num_local_experts", default=1)),
            bos_token_id=c.get("bos_token_id"),
            eos_token_ids=tuple(eos) if isinstance(eos, list) else ((eos,) if eos is not None else ()),
        )
    except (KeyError, TypeError, ValueError) as e:
        raise PreflightError(f"{cfg_path}: missing or invalid field {e}; re-download the checkpoint") from None


def _packaged_model_info(spec: str, role: str, require: bool) -> ModelInfo:
    """A GGUF file (pkg:<module>/<file>.gguf or a path): dimensions from the built-in table by model name."""
    from .reference.checkpoints import SourceError, is_package_source, resolve_package_file

    if require:
        try:
            path = resolve_package_file(spec) if is_package_source(spec) else Path(spec)
        except SourceError as e:
            raise PreflightError(f"{role}.checkpoint {e}") from None
        if not path.is_file():
            raise PreflightError(f"{role}.checkpoint {spec}: file not found")
    key = Path(spec).name.split(".")[0].lower()
    known = KNOWN_MODELS.get(key)
    if known is None:
        raise PreflightError(f"{role}.checkpoint {spec}: GGUF model {key!r} is not in the built-in model table; "
                             "convert it to a Hugging Face directory and point the checkpoint there")
    return ModelInfo(**{**known.__dict__, "source": "model dimensions from the built-in table (GGUF source, imported at build time)"})


def model_info_for(checkpoint: str, role: str, require: bool) -> ModelInfo:
    """Real config.json when present; else (plan only) the built-in table of known models."""
    if checkpoint.startswith("pkg:") or checkpoint.endswith(".gguf"):
        return _packaged_model_info(checkpoint, role, require)
    path = Path(checkpoint)
    if require or path.is_dir():
        return read_model_info(path, role)
    known = KNOWN_MODELS.get(path.name.lower())
    if known is None:
        raise PreflightError(
            f"{role}.checkpoint {checkpoint}: not found, and {path.name!r} is not in the built-in model table; "
            f"point {role}.checkpoint at the Hugging Face directory (--set {role}.checkpoint=DIR)"
        )
    return ModelInfo(**{**known.__dict__, "source": "model dimensions from the built-in table (checkpoint not on this machine)"})


def read_vocab(checkpoint: Path) -> dict[int, str]:
    """id -> token text from tokenizer.json (fast tokenizers) or vocab.json (+ added tokens)."""
    tj = checkpoint / "tokenizer.json"
    vocab: dict[int, str] = {}
    if tj.is_file():
        data = json.loads(tj.read_text())
        model_vocab = (data.get("model") or {}).get("vocab") or {}
        if isinstance(model_vocab, dict):
            vocab.update({int(i): t for t, i in model_vocab.items()})
        elif isinstance(model_vocab, list):  # unigram: [[piece, score], ...]
            vocab.update({i: entry[0] for i, entry in enumerate(model_vocab)})
        for tok in data.get("added_tokens") or []:
            vocab[int(tok["id"])] = tok["content"]
        return vocab
    vj = checkpoint / "vocab.json"
    if vj.is_file():
        vocab.update({int(i): t for t, i in json.loads(vj.read_text()).items()})
        tc = checkpoint / "tokenizer_config.json"
        if tc.is_file():
            for i, tok in (json.loads(tc.read_text()).get("added_tokens_decoder") or {}).items():
                vocab[int(i)] = tok["content"]
        return vocab
    raise PreflightError(
        f"{checkpoint}: no tokenizer.json or vocab.json; copy the tokenizer files into the checkpoint directory "
        "(draft/target compatibility is checked from them)"
    )


def check_tokenizers(target_dir: Path, draft_dir: Path, target: ModelInfo, draft: ModelInfo) -> list[str]:
    """Draft/target must share a vocabulary. Returns notes; raises PreflightError on incompatibility."""
    notes = []
    diff = abs(target.vocab_size - draft.vocab_size)
    if diff > VOCAB_PAD_TOLERANCE:
        raise PreflightError(
            f"vocab sizes differ by {diff} (target {target.vocab_size}, draft {draft.vocab_size}), more than the "
            f"{VOCAB_PAD_TOLERANCE} rows of padding allowed; pick a draft of the same family (same tokenizer)"
        )
    if diff:
        notes.append(f"vocab padding: target {target.vocab_size} vs draft {draft.vocab_size} rows "
                     f"({diff} padded embedding rows; token ids beyond the tokenizer are never produced)")
    tv, dv = read_vocab(target_dir), read_vocab(draft_dir)
    shared = sorted(set(tv) & set(dv))
    for i in shared:
        if i >= FIRST_COMPARED_TOKEN_ID and tv[i] != dv[i]:
            raise PreflightError(
                f"tokenizers differ at token id {i}: target {tv[i]!r} vs draft {dv[i]!r}; the draft must use the "
                "target's tokenizer (same family and version)"
            )
    if len(tv) != len(dv):
        notes.append(f"tokenizer sizes differ (target {len(tv)}, draft {len(dv)}); the {len(shared)} shared ids match")
    if target.bos_token_id != draft.bos_token_id:
        raise PreflightError(f"BOS token differs (target {target.bos_token_id}, draft {draft.bos_token_id}); "
                             "use a draft with the target's tokenizer and special tokens")
    if set(target.eos_token_ids) != set(draft.eos_token_ids):
        raise PreflightError(f"EOS tokens differ (target {list(target.eos_token_ids)}, draft {list(draft.eos_token_ids)}); "
                             "use a draft with the target's tokenizer and special tokens")
    return notes


# ---------------------------------------------------------------------------------------------------------
# Rules


def resolve_quantization(cfg: BuildConfig, gpu: Optional[GpuSpec]) -> tuple[QuantChoice, list[str]]:
    """Effective weight / KV formats for this GPU, applying the configured fallback without FP8."""
    q = cfg.quantization
    warnings: list[str] = []
    if cfg.engine == "reference":
        w = "fp8" if q.weights == "auto" else q.weights
        if w not in ("fp8", "bf16", "fp16", "fp32"):
            raise PreflightError(f"quantization.weights {w}: the reference engine exports fp8, bf16, fp16 or fp32; "
                                 "set quantization.weights: fp8")
        return QuantChoice(weights=w, kv_cache="none"), warnings

    has_fp8 = gpu.has_fp8 if gpu else True
    gname = gpu.name if gpu else "the GPU"
    cc = f"{gpu.compute_capability[0]}.{gpu.compute_capability[1]}" if gpu else "?"
    weights, fell_back = q.weights, False
    if weights == "auto":
        weights = "fp8" if has_fp8 else (q.fallback or "bf16")
        fell_back = not has_fp8
    elif weights == "fp8" and not has_fp8:
        if q.fallback is None:
            raise PreflightError(
                f"quantization.weights fp8 needs compute capability >= 8.9, but {gname} is SM {cc}; set "
                "quantization.fallback: int8_sq (NVIDIA's first choice without FP8) or quantization.weights: bf16"
            )
        weights, fell_back = q.fallback, True
        warnings.append(f"{gname} (SM {cc}) has no FP8: using the configured fallback {weights} instead of fp8")

    external = cfg.speculative.mode in EXTERNAL_DRAFT_MODES
    kv = q.kv_cache
    if kv == "auto":
        kv = {"fp8": "fp8", "int8_sq": "int8"}.get(weights, "none")
        if external and kv == "int8":
            kv = "none"
            warnings.append(f"KV cache kept 16-bit with {weights} weights: an INT8 KV cache turns off paged context "
                            f"FMHA and with it the KV-cache block reuse a {cfg.speculative.mode} target needs")
    elif kv == "fp8" and not has_fp8:
        if fell_back or q.fallback is not None:
            kv = "none" if external else "int8"
            warnings.append(f"{gname} has no FP8: KV cache falls back to {'16-bit' if external else 'int8'}")
        else:
            raise PreflightError(f"quantization.kv_cache fp8 needs compute capability >= 8.9, but {gname} is SM {cc}; "
                                 "set quantization.kv_cache: auto")
    if external and kv == "int8":
        raise PreflightError(
            f"quantization.kv_cache int8 cannot serve speculative mode {cfg.speculative.mode}: TensorRT-LLM turns paged "
            "context FMHA off with an INT8 KV cache, so KV-cache block reuse is off and the executor refuses the "
            "target ('KV cache block reuse must be enabled for speculative decoding target model'); set "
            "quantization.kv_cache: auto (16-bit KV cache)")
    if external and kv == "fp8" and weights != "fp8":
        raise PreflightError(
            f"quantization.kv_cache fp8 with {weights} weights cannot serve speculative mode {cfg.speculative.mode}: "
            "TensorRT-LLM turns paged context FMHA off for an FP8 KV cache without FP8 weights, so the target "
            "cannot reuse KV-cache blocks and fails to load; set quantization.kv_cache: auto")
    return QuantChoice(weights=weights, kv_cache=kv, fell_back=fell_back), warnings


def effective_max_draft_len(cfg: BuildConfig) -> int:
    s = cfg.speculative
    if s.mode == "none":
        return 0
    if s.mode == "lookahead":
        need = s.lookahead.max_draft_len()
        if "max_draft_len" in s.model_fields_set and s.max_draft_len != need:
            w, n, g = s.lookahead.window_size, s.lookahead.ngram_size, s.lookahead.verification_set_size
            raise PreflightError(
                f"speculative.max_draft_len {s.max_draft_len} does not match lookahead (W={w}, N={n}, G={g}), which needs "
                f"(N-2)+(W-1+G)*(N-1) = {need}; remove max_draft_len or set it to {need}"
            )
        return need
    return s.max_draft_len


def _check_speculative(cfg: BuildConfig, k_max: int) -> None:
    s = cfg.speculative
    if s.mode in ("draft_target", "ngram") and k_max < 1:
        raise PreflightError(f"speculative.max_draft_len must be >= 1 for mode {s.mode}, got {k_max}; set it to 4-8")
    if s.num_draft_tokens is not None and s.num_draft_tokens > k_max:
        raise PreflightError(
            f"speculative.num_draft_tokens {s.num_draft_tokens} > max_draft_len {k_max}: the engine would reject "
            "every request; raise speculative.max_draft_len or lower num_draft_tokens"
        )
    if s.use_draft_logits and s.mode != "draft_target":
        raise PreflightError("speculative.use_draft_logits needs mode draft_target (there are no draft logits otherwise)")
    lim = cfg.limits
    if s.mode in EXTERNAL_DRAFT_MODES and lim.max_num_tokens < lim.max_seq_len - 1:
        raise PreflightError(
            f"limits.max_num_tokens {lim.max_num_tokens} < max_seq_len - 1 ({lim.max_seq_len - 1}): without chunked "
            f"context the engine takes at most min(max_seq_len - 1, max_num_tokens) input tokens, and the {s.mode} "
            "loop resends the whole sequence every round, so requests would fail mid-generation; set "
            f"limits.max_num_tokens: {lim.max_seq_len} or lower limits.max_seq_len")
    if s.mode in ("medusa", "eagle"):
        spec = s.medusa if s.mode == "medusa" else s.eagle
        nodes = len(spec.choices) if spec.choices else MEDUSA_DEFAULT_TREE_NODES
        if k_max < nodes:
            raise PreflightError(
                f"speculative.max_draft_len {k_max} < {nodes} nodes of the {s.mode} tree; set max_draft_len: {nodes} "
                f"or give a smaller speculative.{s.mode}.choices"
            )


def _check_parallel(role: str, tp: int, pp: int, info: ModelInfo) -> None:
    if pp > 1 and TRTLLM_ARCHITECTURES.get(info.architecture) == "gemma":
        raise PreflightError(f"{role}.pp {pp}: Gemma's convert_checkpoint.py supports tensor parallelism only "
                             "(--world-size = tp); set pp: 1")
    if info.num_kv_heads % tp:
        raise PreflightError(
            f"{role}.tp {tp} does not divide the {info.num_kv_heads} KV heads of {role}; use tp in "
            f"{[d for d in range(1, info.num_kv_heads + 1) if info.num_kv_heads % d == 0]}"
        )
    if info.num_heads % tp:
        raise PreflightError(f"{role}.tp {tp} does not divide the {info.num_heads} attention heads of {role}")
    if pp > info.num_layers:
        raise PreflightError(f"{role}.pp {pp} exceeds the {info.num_layers} layers of {role}")


def _weights_gib(info: ModelInfo, weights: str) -> float:
    linear, embed = info.param_counts()
    # ModelOpt quantizes the linear layers; embeddings, norms and the LM head stay 16-bit.
    embed_bytes = 4.0 if weights == "fp32" else 2.0
    return (linear * BYTES_PER_WEIGHT[weights] + embed * embed_bytes) / GIB


def kv_cache_gib(info: ModelInfo, kv: str, batch: int, seq: int) -> float:
    """layers x kv_heads x head_dim x 2 (K and V) x bytes x max_batch_size x max_seq_len."""
    return info.num_layers * info.num_kv_heads * info.head_dim * 2 * BYTES_PER_KV[kv] * batch * seq / GIB


def _memory_rows(role: str, info: ModelInfo, quant: QuantChoice, tp: int, pp: int, devices: list[int],
                 cfg: BuildConfig) -> list[MemoryRow]:
    w = _weights_gib(info, quant.weights) / (tp * pp)
    kv = kv_cache_gib(info, quant.kv_cache, cfg.limits.max_batch_size, cfg.limits.max_seq_len) / (tp * pp)
    return [MemoryRow(d, role, w, kv, cfg.runtime.memory_reserve_gib) for d in devices]


def shared_gpu_kv_fraction(memory: list[MemoryRow], gpu_gib: float) -> float:
    """Target kv_cache_free_gpu_mem_fraction on a GPU shared with the draft: the share of the memory left after
    the target's weights and reserve that still leaves the draft's weights, capped KV cache and reserve free
    (rounded down to 0.05; the executor's default 0.9 at most)."""
    fracs = []
    for gid in {r.gpu_id for r in memory if r.role == "draft"}:
        t = [r for r in memory if r.gpu_id == gid and r.role == "target"]
        d = sum(r.total_gib for r in memory if r.gpu_id == gid and r.role == "draft")
        if not t:
            continue
        free = gpu_gib - t[0].weights_gib - t[0].reserve_gib
        fracs.append((free - d) / free if free > 0 else 0.0)
    f = min(fracs, default=DEFAULT_KV_FRACTION)
    return round(max(0.05, min(DEFAULT_KV_FRACTION, math.floor(f * 20) / 20)), 2)


def run_preflight(cfg: BuildConfig, gpu: Optional[GpuSpec], *, require_checkpoints: bool) -> PreflightReport:
    """All checks, cheapest first. `require_checkpoints=False` (plan) tolerates absent checkpoints."""
    warnings: list[str] = []
    notes: list[str] = []
    if cfg.engine == "tensorrt" and gpu is None:
        raise PreflightError("no GPU found (nvidia-smi absent); pass --gpu NAME (e.g. h100, h200, a100-80gb) or set gpu: in the config")

    k_max = effective_max_draft_len(cfg)
    _check_speculative(cfg, k_max)
    quant, qwarn = resolve_quantization(cfg, gpu)
    warnings += qwarn
    if cfg.speculative.mode == "eagle" and quant.weights not in ("bf16", "fp16"):
        raise PreflightError(f"EAGLE engines are FP16/BF16 only in TensorRT-LLM 1.2 (got {quant.weights}); "
                             "set quantization.weights: bf16")
    if cfg.speculative.mode == "medusa" and cfg.speculative.use_draft_logits:
        raise PreflightError("Medusa is greedy-only in TensorRT-LLM; remove use_draft_logits")

    target = model_info_for(cfg.target.checkpoint, "target", require_checkpoints)
    draft = None
    if cfg.draft is not None and cfg.draft.distill is not None:
        d = cfg.draft.distill
        draft = ModelInfo(**{**target.__dict__, "num_layers": d.num_layers, "hidden_size": d.hidden_size,
                             "num_heads": max(1, d.hidden_size // 64), "num_kv_heads": max(1, d.hidden_size // 64),
                             "intermediate_size": d.hidden_size * 4, "tie_word_embeddings": True,
                             "source": "distilled from the target at build time (same tokenizer by construction)"})
    elif cfg.draft is not None:
        draft = model_info_for(cfg.draft.checkpoint, "draft", require_checkpoints)
    for role, info in (("target", target), ("draft", draft)):
        if info is None:
            continue
        if info.source != "checkpoint":
            notes.append(f"{role}: {info.source}")
        allowed = REFERENCE_ARCHITECTURES if cfg.engine == "reference" else set(TRTLLM_ARCHITECTURES)
        if info.architecture not in allowed:
            what = "the reference engine" if cfg.engine == "reference" else "TensorRT-LLM 1.2's engine flow"
            raise PreflightError(f"{role}: architecture {info.architecture} is not one {what} builds; supported: "
                                 f"{', '.join(sorted(allowed))}")
        if info.max_position_embeddings and cfg.limits.max_seq_len > info.max_position_embeddings:
            raise PreflightError(
                f"limits.max_seq_len {cfg.limits.max_seq_len} exceeds {role}'s max_position_embeddings "
                f"{info.max_position_embeddings}; lower limits.max_seq_len"
            )
    if cfg.engine == "tensorrt":
        _check_parallel("target", cfg.target.tp, cfg.target.pp, target)
        if draft is not None:
            _check_parallel("draft", cfg.draft.tp, cfg.draft.pp, draft)
    elif cfg.target.world_size > 1 or (cfg.draft and cfg.draft.world_size > 1):
        raise PreflightError("the reference engine runs on one CPU process; set target.tp/pp and draft.tp/pp to 1")

    if draft is not None and cfg.speculative.use_draft_logits and draft.vocab_size != target.vocab_size:
        raise PreflightError(
            f"speculative.use_draft_logits with different vocab sizes (target {target.vocab_size}, draft "
            f"{draft.vocab_size}): the draft's logits would be {draft.vocab_size} wide where the target expects "
            f"{target.vocab_size}; set use_draft_logits: false (greedy and token-matching acceptance need no logits)")
    if draft is not None and cfg.draft.checkpoint is not None:
        tdir, ddir = Path(cfg.target.checkpoint), Path(cfg.draft.checkpoint)
        if tdir.is_dir() and ddir.is_dir():
            notes += check_tokenizers(tdir, ddir, target, draft)
        else:
            if target.vocab_size != draft.vocab_size:
                notes.append(f"vocab padding: target {target.vocab_size} vs draft {draft.vocab_size} rows")
            warnings.append("tokenizer compatibility not checked: checkpoints not on this machine (checked by build)")

    if require_checkpoints:
        for spec_name in ("medusa", "eagle"):
            spec = getattr(cfg.speculative, spec_name)
            if cfg.speculative.mode == spec_name and not (Path(spec.heads_dir) / "config.json").is_file():
                raise PreflightError(f"speculative.{spec_name}.heads_dir {spec.heads_dir}: no config.json; point it at "
                                     f"the {spec_name} heads checkpoint")
        if cfg.quantization.calib_dataset and not Path(cfg.quantization.calib_dataset).is_dir():
            raise PreflightError(f"quantization.calib_dataset {cfg.quantization.calib_dataset}: directory not found; "
                                 "point it at a local dataset directory or remove it")

    # Devices and memory (GPU engines only)
    # The draft never needs more KV cache than max_batch_size full sequences: cap it, or the backend's fraction
    # of free memory lets a 1B draft that loads first take most of the GPU from the target.
    draft_kv = (-(-cfg.limits.max_batch_size * cfg.limits.max_seq_len // TOKENS_PER_BLOCK) * TOKENS_PER_BLOCK
                if draft is not None else None)
    t_dev = cfg.runtime.gpu_device_ids or list(range(cfg.target.world_size))
    d_dev: list[int] = []
    if cfg.draft is not None:
        d_dev = cfg.runtime.draft_gpu_device_ids or t_dev[: cfg.draft.world_size]
    memory: list[MemoryRow] = []
    kv_frac = cfg.runtime.kv_cache_free_gpu_mem_fraction
    if cfg.engine == "tensorrt":
        if len(t_dev) != cfg.target.world_size:
            raise PreflightError(f"runtime.gpu_device_ids has {len(t_dev)} ids but the target needs tp*pp = "
                                 f"{cfg.target.world_size}; list exactly {cfg.target.world_size} ids")
        if cfg.draft is not None and len(d_dev) != cfg.draft.world_size:
            raise PreflightError(f"runtime.draft_gpu_device_ids has {len(d_dev)} ids but the draft needs tp*pp = "
                                 f"{cfg.draft.world_size}; list exactly {cfg.draft.world_size} ids")
        used = sorted(set(t_dev) | set(d_dev))
        if used and max(used) >= gpu.count:
            raise PreflightError(f"GPU ids {used} need {max(used) + 1} GPUs but {gpu.describe()}; lower tp or use a "
                                 "bigger node (--gpu NAME:COUNT)")
        shares = bool(set(t_dev) & set(d_dev))
        memory += _memory_rows("target", target, quant, cfg.target.tp, cfg.target.pp, t_dev, cfg)
        if draft is not None:
            memory += _memory_rows("draft", draft, quant, cfg.draft.tp, cfg.draft.pp, d_dev, cfg)
        if kv_frac is None:
            kv_frac = DEFAULT_KV_FRACTION
            if shares:
                kv_frac = shared_gpu_kv_fraction(memory, gpu.memory_gib)
                notes.append(f"draft and target share GPU(s) {sorted(set(t_dev) & set(d_dev))}: the draft's KV cache is "
                             f"capped at {draft_kv:,} tokens (max_tokens_in_paged_kv_cache) and the target takes "
                             f"{kv_frac} of the memory left free (kv_cache_free_gpu_mem_fraction), so whichever loads "
                             "first leaves room for the other")
        for gid, total in sorted(_totals(memory).items()):
            if total > gpu.memory_gib:
                parts = ", ".join(f"{r.role} weights {r.weights_gib:.1f} + KV {r.kv_gib:.1f} + reserve {r.reserve_gib:.1f}"
                                  for r in memory if r.gpu_id == gid)
                raise PreflightError(
                    f"GPU {gid} ({gpu.name}, {gpu.memory_gib:.1f} GiB) needs {total:.1f} GiB ({parts}); lower "
                    "limits.max_batch_size or limits.max_seq_len, raise tp, use FP8/INT8 KV cache, or move the draft "
                    "to another GPU (runtime.draft_gpu_device_ids)"
                )
        calib_gib = target.num_params * 2 / GIB * CALIBRATION_PEAK_FACTOR
        total_gib = gpu.memory_gib * gpu.count
        if quant.weights not in ("bf16", "fp16") and calib_gib > total_gib:
            warnings.append(f"calibrating the target loads ~{calib_gib:.0f} GiB of 16-bit weights, more than this "
                            f"node's {total_gib:.0f} GiB: run the quantize step on a bigger node (e.g. 4x80 GB for 70B)")
        if cfg.speculative.mode == "medusa":
            notes.append("Medusa decoding is greedy only (temperature is ignored by the engine)")
    else:
        kv_frac = kv_frac or DEFAULT_KV_FRACTION

    return PreflightReport(cfg, gpu, target, draft, quant, t_dev, d_dev, kv_frac, k_max, draft_kv, memory, warnings,
                           notes)
