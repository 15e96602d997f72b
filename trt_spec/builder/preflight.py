"""Preflight: every check that can fail a build, before any expensive step; each failure is one PreflightError line.

Checkpoints are read offline from config.json / tokenizer files only (no torch, no transformers).
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Optional

from ..records.backend_contract import generation_logits_cache_bytes
from ..records.config import BuildConfig
from ..records.defaults import CALIB_BATCH_SIZE, DEFAULT_KV_FRACTION, TOKENS_PER_BLOCK, served_num_draft_tokens
from ..records.deployment import (
    Deployment,
    Limits,
    Lookahead,
    Models,
    Placement,
    Speculation,
    SuffixCacheConfig,
    WorldSize,
)
from ..records.llmapi_contract import EAGLE3_SUPPORT, MTP_ARCHITECTURES
from ..records.memory import (
    GIB,
    LLMAPI_SPEC_MODEL_WEIGHTS,
    MemoryRow,
    calibration_peak,
    memory_rows,
    shared_gpu_kv_fraction,
    totals_per_gpu,
)
from ..records.recipes import RecipeError, recipe
from ..records.speculation import Mode
from .calibration import BUNDLED_CALIB_DATASET, CalibSet, calibrates, check_calib_dataset, quantizes
from .hardware import GpuSpec
from .model_info import ModelInfo, PreflightError, is_imported, model_info_for, read_vocab
from .prequant import SERVED_ALGOS, PreQuant, prequant_for
from .trtllm import MEDUSA_DEFAULT_TREE_NODES, TRTLLM_ARCHITECTURES

# The CPU reference engine implements the Llama-style decoder.
REFERENCE_ARCHITECTURES = {"LlamaForCausalLM", "Qwen2ForCausalLM", "MistralForCausalLM"}

VOCAB_PAD_TOLERANCE = 128
FIRST_COMPARED_TOKEN_ID = 5


@dataclass(frozen=True)
class QuantChoice:
    weights: str  # one of memory.BYTES_PER_WEIGHT
    kv_cache: str  # fp8 | int8 | none
    fell_back: bool = False

    @property
    def fp8_context_fmha(self) -> bool:
        """Whether trtllm-build turns FP8 context FMHA on by itself (upstream-facts: trtllm-build-fp8-context-fmha)."""
        return self.weights == "fp8" and self.kv_cache == "fp8"


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
    # max_tokens_in_paged_kv_cache of the draft or baseline engine sharing the target's GPUs
    draft_kv_tokens: Optional[int] = None
    memory: list[MemoryRow] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    head: Optional[ModelInfo] = None  # llmapi eagle3: the EAGLE-3 head
    calibration: Optional[CalibSet] = None  # None when nothing is calibrated
    # role -> a ModelOpt pre-quantized checkpoint's facts: converted as it is, never calibrated
    prequantized: dict[str, PreQuant] = field(default_factory=dict)
    calibration_peaks: dict[str, dict] = field(default_factory=dict)  # role -> estimated GiB (floor, ceiling)

    @property
    def num_draft_tokens(self) -> int:
        """The k of a request that names none."""
        return served_num_draft_tokens(self.config.speculative.default_k, self.max_draft_len)

    def deployment(self, tokenizer_dir: str) -> Deployment:
        """What this build serves, resolved once: every later stage reads this record, not the config."""
        cfg, s = self.config, self.config.speculative
        la = s.lookahead
        return Deployment(
            runtime=cfg.runtime,
            engine=cfg.engine,
            speculation=Speculation(
                mode=s.mode,
                max_draft_len=self.max_draft_len,
                num_draft_tokens=self.num_draft_tokens,
                ngram_size=s.ngram_size,
                draft_len_policy=s.draft_len_policy,
                proposer=s.proposer,
                use_draft_logits=s.use_draft_logits,
                suffix_cache=SuffixCacheConfig(**s.suffix_cache.model_dump()),
                medusa_choices=s.medusa.choices if s.medusa else None,
                eagle_choices=s.eagle.choices if s.eagle else None,
                lookahead=Lookahead(**la.model_dump()) if la else None,
                eagle3_one_model=s.eagle3.one_model if s.eagle3 else True,
                num_nextn_predict_layers=s.mtp.num_nextn_predict_layers if s.mtp else None,
            ),
            limits=Limits(**cfg.limits.model_dump()),
            placement=Placement(
                target_devices=list(self.target_devices),
                draft_devices=list(self.draft_devices),
                kv_cache_free_gpu_mem_fraction=self.kv_cache_free_gpu_mem_fraction,
                draft_max_tokens_in_paged_kv_cache=self.draft_kv_tokens,
                world_size=WorldSize(
                    cfg.target.world_size,
                    draft_world := cfg.draft.world_size if cfg.draft else 0,
                    cfg.target.world_size + draft_world,
                ),
                memory_reserve_gib=cfg.serving.memory_reserve_gib,
            ),
            weights=self.quant.weights,
            kv_cache=self.quant.kv_cache,
            tokenizer_dir=tokenizer_dir,
            models=Models(self.target, self.draft, self.head),
        )

    @property
    def shares_gpu(self) -> bool:
        return bool(set(self.target_devices) & set(self.draft_devices))

    def gpu_totals(self) -> dict[int, float]:
        return totals_per_gpu(self.memory)

    def memory_table(self) -> str:
        if not self.memory:
            return "memory plan: not applicable (no GPU)"
        cap = self.gpu.memory_gib if self.gpu else float("nan")
        lines = [f"{'GPU':>3}  {'model':<8}  {'weights':>9}  {'KV cache':>9}  {'reserve':>8}  {'total':>8}"]
        for r in self.memory:
            lines.append(
                f"{r.gpu_id:>3}  {r.role:<8}  {r.weights_gib:>7.1f}Gi  {r.kv_gib:>7.1f}Gi  "
                f"{r.reserve_gib:>6.1f}Gi  {r.total_gib:>6.1f}Gi"
            )
        for gid, tot in sorted(self.gpu_totals().items()):
            lines.append(f"{gid:>3}  {'sum':<8}  {'':>9}  {'':>9}  {'':>8}  {tot:>6.1f}Gi of {cap:.1f}Gi")
        f = self.kv_cache_free_gpu_mem_fraction
        for r in (r for r in self.memory if r.role == "target"):  # what the executor will really allocate
            free = cap - r.weights_gib - r.reserve_gib
            lines.append(
                f"{r.gpu_id:>3}  KV budget at load: {f:.2f} x {free:.1f}Gi free after the target's weights = "
                f"{f * free:.1f}Gi (max_batch_size full sequences need {r.kv_gib:.1f}Gi)"
            )
        return "\n".join(lines)


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
        notes.append(
            f"vocab padding: target {target.vocab_size} vs draft {draft.vocab_size} rows "
            f"({diff} padded embedding rows; token ids beyond the tokenizer are never produced)"
        )
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
        raise PreflightError(
            f"BOS token differs (target {target.bos_token_id}, draft {draft.bos_token_id}); "
            "use a draft with the target's tokenizer and special tokens"
        )
    if set(target.eos_token_ids) != set(draft.eos_token_ids):
        raise PreflightError(
            f"EOS tokens differ (target {list(target.eos_token_ids)}, draft {list(draft.eos_token_ids)}); "
            "use a draft with the target's tokenizer and special tokens"
        )
    return notes


def resolve_quantization(cfg: BuildConfig, gpu: Optional[GpuSpec]) -> tuple[QuantChoice, list[str]]:
    """Effective weight / KV formats for this GPU, applying the configured fallback without FP8."""
    q = cfg.quantization
    warnings: list[str] = []
    if not cfg.recipe.gpu:
        w = "fp8" if q.weights == "auto" else q.weights
        if w not in ("fp8", "bf16", "fp16", "fp32"):
            raise PreflightError(
                f"quantization.weights {w}: the reference engine exports fp8, bf16, fp16 or fp32; "
                "set quantization.weights: fp8"
            )
        return QuantChoice(weights=w, kv_cache="none"), warnings

    has_fp8 = gpu.has_fp8 if gpu else True
    gname = gpu.name if gpu else "the GPU"
    cc = f"{gpu.compute_capability[0]}.{gpu.compute_capability[1]}" if gpu else "?"
    if cfg.recipe.llm_api:
        return _llmapi_quantization(cfg, has_fp8, gname, cc)
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

    external = cfg.recipe.loop_in_bls  # a draft_tokens_external target
    kv = q.kv_cache
    if kv == "auto":
        kv = {"fp8": "fp8", "int8_sq": "int8"}.get(weights, "none")
        if external and kv == "int8":
            kv = "none"
            warnings.append(
                f"KV cache kept 16-bit with {weights} weights: an INT8 KV cache turns off paged context "
                f"FMHA and with it the KV-cache block reuse a {cfg.speculative.mode} target needs"
            )
    elif kv == "fp8" and not has_fp8:
        if fell_back or q.fallback is not None:
            kv = "none" if external else "int8"
            warnings.append(f"{gname} has no FP8: KV cache falls back to {'16-bit' if external else 'int8'}")
        else:
            raise PreflightError(
                f"quantization.kv_cache fp8 needs compute capability >= 8.9, but {gname} is SM {cc}; "
                "set quantization.kv_cache: auto"
            )
    if external and kv == "int8":
        raise PreflightError(
            "quantization.kv_cache int8 cannot serve speculative mode "
            f"{cfg.speculative.mode}: TensorRT-LLM turns paged "
            "context FMHA off with an INT8 KV cache, so KV-cache block reuse is off and the executor refuses the "
            "target ('KV cache block reuse must be enabled for speculative decoding target model'); set "
            "quantization.kv_cache: auto (16-bit KV cache)"
        )
    if external and kv == "fp8" and weights != "fp8":
        raise PreflightError(
            f"quantization.kv_cache fp8 with {weights} weights cannot serve speculative mode {cfg.speculative.mode}: "
            "TensorRT-LLM turns paged context FMHA off for an FP8 KV cache without FP8 weights, so the target "
            "cannot reuse KV-cache blocks and fails to load; set quantization.kv_cache: auto"
        )
    return QuantChoice(weights=weights, kv_cache=kv, fell_back=fell_back), warnings


def checkpoint_quant_method(checkpoint: str) -> Optional[str]:
    """config.json's quantization_config.quant_method (e.g. "fp8"), None when unquantized or not on this machine."""
    f = Path(checkpoint) / "config.json"
    if not f.is_file():
        return None
    try:
        q = json.loads(f.read_text()).get("quantization_config") or {}
    except (OSError, ValueError):
        return None
    return str(q.get("quant_method") or q.get("quant_algo") or "").lower() or None


def _llmapi_quantization(cfg: BuildConfig, has_fp8: bool, gname: str, cc: str) -> tuple[QuantChoice, list[str]]:
    """runtime: llmapi, which cannot quantize: FP8 weights come pre-quantized, FP8 KV is kv_cache_config.dtype.

    Both need SM >= 8.9 (upstream-facts: llmapi-pytorch-no-quant-pass)."""
    q, warnings = cfg.quantization, []
    method = checkpoint_quant_method(cfg.target.checkpoint)
    present = (Path(cfg.target.checkpoint) / "config.json").is_file()
    weights = q.weights
    if weights == "auto":
        weights = "fp8" if method == "fp8" else "bf16"
    if weights == "fp8" and is_imported(cfg.target.checkpoint):
        raise PreflightError(
            f"quantization.weights fp8 on runtime llmapi needs a pre-quantized FP8 checkpoint, but "
            f"target.checkpoint {cfg.target.checkpoint} is a GGUF file that the build imports as a "
            "BF16 Hugging Face directory; set quantization.weights: bf16 (the LLM API quantizes nothing "
            "itself; the engine twin, runtime: engine, runs it in FP8)"
        )
    if weights == "fp8":
        if not has_fp8:
            raise PreflightError(
                f"FP8 weights need compute capability >= 8.9, but {gname} is SM {cc}; use a BF16 "
                "checkpoint and quantization.weights: bf16 (the LLM API quantizes nothing itself)"
            )
        if present and method != "fp8":
            raise PreflightError(
                f"quantization.weights fp8 on runtime llmapi needs a pre-quantized FP8 checkpoint, but "
                f"{cfg.target.checkpoint}/config.json has no FP8 quantization_config; point "
                "target.checkpoint at an FP8 checkpoint (e.g. nvidia/Llama-3.3-70B-Instruct-FP8) or set "
                "quantization.weights: bf16"
            )
        if not present:
            warnings.append("runtime llmapi: the target must be a pre-quantized FP8 checkpoint (checked by build)")
    elif weights not in ("bf16", "fp16"):
        raise PreflightError(
            f"quantization.weights {weights}: runtime llmapi serves a checkpoint as it is (fp8 "
            "pre-quantized, bf16 or fp16); set quantization.weights: fp8, bf16 or auto"
        )
    kv = q.kv_cache
    if kv == "auto":
        kv = "fp8" if has_fp8 and weights == "fp8" else "none"
    elif kv == "fp8" and not has_fp8:
        raise PreflightError(
            f"quantization.kv_cache fp8 needs compute capability >= 8.9, but {gname} is SM {cc}; set "
            "quantization.kv_cache: auto"
        )
    elif kv == "int8":
        raise PreflightError(
            "quantization.kv_cache int8: runtime llmapi's KV cache is fp8 or the model's dtype; set "
            "quantization.kv_cache: auto or fp8"
        )
    return QuantChoice(weights=weights, kv_cache=kv), warnings


# A warning, not a refusal: the fix is unverified in 1.2.1 (upstream-facts: trtllm-eagle3-fp8-kv-assert).
EAGLE3_FP8_KV_RISK = (
    "EAGLE-3 one-model with an FP8 KV cache: TensorRT-LLM #7842 (a 16-bit head over an FP8-KV target "
    "asserted 'KV cache data type e4m3 is not the same as input data type' on the first request) was "
    "fixed by PR #8910 in 2025-11, not verified in 1.2.1 here; if the first request fails so, set "
    "speculative.eagle3.one_model: false (two-model: the head keeps its own KV cache)"
)


def _llmapi_checks(cfg: BuildConfig, target: ModelInfo, require: bool) -> tuple[Optional[ModelInfo], list[str]]:
    """runtime: llmapi: the EAGLE-3 head fits the target and its form; MTP needs MTP layers. Returns (head, notes)."""
    s, notes = cfg.speculative, []
    head = None
    if s.mode is Mode.EAGLE3:
        one, two = EAGLE3_SUPPORT.get(target.architecture, (False, False))
        form = "one-model" if s.eagle3.one_model else "two-model"
        if not (one if s.eagle3.one_model else two):
            supported = ", ".join(a for a, (o, t) in EAGLE3_SUPPORT.items() if (o if s.eagle3.one_model else t))
            raise PreflightError(
                f"EAGLE-3 {form} is not served for {target.architecture} by TensorRT-LLM 1.2's LLM API "
                f"(architectures: {supported}); pick another speculative.mode (draft_target, ngram)"
            )
        cfg_file = Path(s.eagle3.heads_dir) / "config.json"
        if cfg_file.is_file():
            hc = json.loads(cfg_file.read_text())
            arch = " ".join(hc.get("architectures") or [])
            if "eagle3" not in arch.lower() and "eagle_config" not in hc:
                raise PreflightError(
                    f"speculative.eagle3.heads_dir {s.eagle3.heads_dir}: config.json is not an EAGLE-3 "
                    f"head (architectures {arch or 'none'}); point it at an EAGLE-3 head for the target"
                )
            for key, want in (("hidden_size", target.hidden_size), ("vocab_size", target.vocab_size)):
                if hc.get(key) != want:
                    raise PreflightError(
                        f"speculative.eagle3.heads_dir: the head's {key} {hc.get(key)} differs from the "
                        f"target's {want}: it was trained for another model; use the target's EAGLE-3 head"
                    )
            head = replace(
                target,
                num_layers=int(hc.get("num_hidden_layers", 1)),
                vocab_size=int(hc.get("draft_vocab_size") or hc.get("vocab_size")),
                source="checkpoint",
            )
        elif require:
            raise PreflightError(
                f"speculative.eagle3.heads_dir {s.eagle3.heads_dir}: no config.json; point it at the "
                "EAGLE-3 head checkpoint"
            )
        else:
            head = replace(target, num_layers=1, source="estimated: one decoder layer + the head's LM head")
            notes.append("EAGLE-3 head not on this machine: its memory estimated as one decoder layer of the target")
        notes.append(f"EAGLE-3 {form}: the head runs beside the target on its GPUs (LLM API, decoding_type Eagle)")
    if s.mode is Mode.MTP:
        if target.architecture not in MTP_ARCHITECTURES:
            raise PreflightError(
                f"speculative.mode mtp needs a model with MTP layers (DeepSeek-V3 family: "
                f"{', '.join(MTP_ARCHITECTURES)}); {target.architecture} has none; use eagle3 or ngram"
            )
        f = Path(cfg.target.checkpoint) / "config.json"
        if f.is_file():
            layers = int(json.loads(f.read_text()).get("num_nextn_predict_layers") or 0)
            if layers < 1:
                raise PreflightError(
                    f"speculative.mode mtp: {cfg.target.checkpoint}/config.json has no "
                    "num_nextn_predict_layers; the checkpoint carries no MTP layers"
                )
    return head, notes


def effective_max_draft_len(cfg: BuildConfig) -> int:
    s = cfg.speculative
    if s.mode is Mode.NONE:
        return 0
    if s.mode is Mode.MTP:  # upstream-facts: llmapi-mtp-max-draft-len
        return s.mtp.num_nextn_predict_layers
    if s.mode is Mode.LOOKAHEAD:
        need = s.lookahead.max_draft_len()
        if "max_draft_len" in s.model_fields_set and s.max_draft_len != need:
            w, n, g = s.lookahead.window_size, s.lookahead.ngram_size, s.lookahead.verification_set_size
            raise PreflightError(
                f"speculative.max_draft_len {s.max_draft_len} does not match lookahead "
                f"(W={w}, N={n}, G={g}), which needs "
                f"(N-2)+(W-1+G)*(N-1) = {need}; remove max_draft_len or set it to {need}"
            )
        return need
    return s.max_draft_len


# The GGUF import's needs beyond torch + transformers (upstream-facts: transformers-gguf-needs-accelerate).
GGUF_IMPORT_MODULES = ("gguf", "accelerate")


def _check_imported_sources(cfg: BuildConfig, target: ModelInfo, require: bool) -> None:
    """A GGUF target and a distilled draft: the distiller needs a Llama teacher, the import GGUF_IMPORT_MODULES."""
    import importlib.util

    if cfg.draft is not None and cfg.draft.distill is not None and target.architecture != "LlamaForCausalLM":
        raise PreflightError(
            f"draft.distill distills a LlamaForCausalLM draft from a Llama target, but the target is "
            f"{target.architecture}; give draft.checkpoint (a draft of the target's family) instead"
        )
    if require and is_imported(cfg.target.checkpoint):
        missing = [m for m in GGUF_IMPORT_MODULES if importlib.util.find_spec(m) is None]
        if missing:
            raise PreflightError(
                f"target.checkpoint {cfg.target.checkpoint}: importing a GGUF file needs "
                f"{' and '.join(missing)} in this python ({sys.executable}); run "
                f"`{sys.executable} -m pip install {' '.join(missing)}` (make gpu-smoke does)"
            )


def _check_speculative(cfg: BuildConfig, k_max: int) -> None:
    s, rec = cfg.speculative, cfg.recipe
    if rec.drafts and k_max < 1:
        raise PreflightError(f"speculative.max_draft_len must be >= 1 for mode {s.mode}, got {k_max}; set it to 4-8")
    if s.num_draft_tokens is not None and s.num_draft_tokens > k_max:
        raise PreflightError(
            f"speculative.num_draft_tokens {s.num_draft_tokens} > max_draft_len {k_max}: the engine would reject "
            "every request; raise speculative.max_draft_len or lower num_draft_tokens"
        )
    if s.use_draft_logits and s.mode is not Mode.DRAFT_TARGET:
        raise PreflightError(
            "speculative.use_draft_logits needs mode draft_target (there are no draft logits otherwise)"
        )
    lim = cfg.limits
    # llmapi: a full batch's step of 1 + max_draft_len tokens each must fit max_num_tokens
    # (upstream-facts: trtllm-one-model-draft-max-num-tokens)
    if rec.llm_api and rec.drafts and lim.max_batch_size * (k_max + 1) > lim.max_num_tokens:
        raise PreflightError(
            f"limits.max_num_tokens {lim.max_num_tokens} < max_batch_size x (max_draft_len + 1) = "
            f"{lim.max_batch_size} x {k_max + 1} = {lim.max_batch_size * (k_max + 1)}: a full batch of {s.mode} "
            "steps does not fit one forward pass of TensorRT-LLM's LLM API; raise limits.max_num_tokens to "
            f"{lim.max_batch_size * (k_max + 1)} or lower limits.max_batch_size or max_draft_len"
        )
    if rec.loop_in_bls and lim.max_num_tokens < lim.max_seq_len - 1:
        raise PreflightError(
            f"limits.max_num_tokens {lim.max_num_tokens} < max_seq_len - 1 ({lim.max_seq_len - 1}): without chunked "
            f"context the engine takes at most min(max_seq_len - 1, max_num_tokens) input tokens, and the {s.mode} "
            "loop resends the whole sequence every round, so requests would fail mid-generation; set "
            f"limits.max_num_tokens: {lim.max_seq_len} or lower limits.max_seq_len"
        )
    if rec.tree:
        spec = s.medusa if s.mode is Mode.MEDUSA else s.eagle
        nodes = len(spec.choices) if spec.choices else MEDUSA_DEFAULT_TREE_NODES
        if k_max < nodes:
            raise PreflightError(
                f"speculative.max_draft_len {k_max} < {nodes} nodes of the {s.mode} tree; set max_draft_len: {nodes} "
                f"or give a smaller speculative.{s.mode}.choices"
            )


def _check_parallel(role: str, tp: int, pp: int, info: ModelInfo) -> None:
    if pp > 1 and TRTLLM_ARCHITECTURES.get(info.architecture) == "gemma":
        raise PreflightError(
            f"{role}.pp {pp}: Gemma's convert_checkpoint.py supports tensor parallelism only "
            "(--world-size = tp); set pp: 1"
        )
    if info.num_kv_heads % tp:
        raise PreflightError(
            f"{role}.tp {tp} does not divide the {info.num_kv_heads} KV heads of {role}; use tp in "
            f"{[d for d in range(1, info.num_kv_heads + 1) if info.num_kv_heads % d == 0]}"
        )
    if info.num_heads % tp:
        raise PreflightError(f"{role}.tp {tp} does not divide the {info.num_heads} attention heads of {role}")
    if pp > info.num_layers:
        raise PreflightError(f"{role}.pp {pp} exceeds the {info.num_layers} layers of {role}")


def _calibration_set(
    cfg: BuildConfig, quant: QuantChoice, require: bool, prequant: dict[str, PreQuant]
) -> tuple[Optional[CalibSet], list[str]]:
    """The validated set quantize.py calibrates on, and a note saying which (None: no role is calibrated)."""
    q = cfg.quantization
    roles = ["target"] + (["draft"] if cfg.draft is not None else [])
    if not calibrates(cfg.engine, cfg.runtime, quant.weights, quant.kv_cache) or all(r in prequant for r in roles):
        why = f"{quant.weights} weights, KV cache {quant.kv_cache}"
        if prequant:
            why = "the checkpoints are pre-quantized"
        unused = f"quantization.calib_dataset is not used: nothing is calibrated ({why})" if q.calib_dataset else None
        return None, [unused] if unused else []
    cal = check_calib_dataset(q.calib_dataset, q.calib_size, q.calib_max_seq_length, require=require)
    note = f"calibration set: {cal.describe()}"
    if cal.path is None:
        note += (
            f"; an offline host needs quantization.calib_dataset: a local directory or the bundled "
            f"{BUNDLED_CALIB_DATASET}"
        )
    elif cal.samples is None and not Path(cal.path).exists():
        note += " (not on this machine: checked by build)"
    return cal, [note]


def _check_calibration_fits(
    cfg: BuildConfig,
    quant: QuantChoice,
    models: list[tuple[str, ModelInfo]],
    gpu: GpuSpec,
    allow_offload: Optional[bool],
) -> list[str]:
    """quantize.py's memory (records/memory.py calibration_peak) against the GPUs it sees, for the largest model it
    quantizes (one at a time). Below the floor accelerate must offload to host memory (hours, and a fragile export;
    upstream-facts: modelopt-quantize-device-map-auto): refused unless allow_offload (None: warns). Between the floor
    and the ceiling it may: a warning."""
    if not quantizes(cfg.engine, cfg.runtime, quant.weights) or not models:
        return []
    role, info = max(models, key=lambda m: m[1].num_params)
    peak = calibration_peak(info, CALIB_BATCH_SIZE, cfg.quantization.calib_max_seq_length)
    have = gpu.memory_gib * gpu.count
    ceiling = peak.ceiling_gib(gpu.count)
    if ceiling <= have:
        return []
    what = f"quantizing the {role} to {quant.weights} (quantize.py)"
    if peak.floor_gib <= have:
        return [
            f"{what} holds ~{peak.floor_gib:.0f} GiB (16-bit weights + one calibration batch) and up to "
            f"~{ceiling:.0f} GiB with each GPU's CUDA context and placement slack, against the {have:.0f} GiB of "
            f"{gpu.describe()}: accelerate may offload part of it to host memory (slow); the quantize step's log "
            "directory gets its measured peak (quantize-peak.json)"
        ]
    gpus = peak.gpus_needed(gpu.memory_gib)
    what += (
        f" holds at least ~{peak.floor_gib:.0f} GiB (16-bit weights {peak.weights_gib:.0f} + one calibration batch), "
        f"more than the {have:.0f} GiB of {gpu.describe()}"
    )
    if allow_offload is None:
        return [f"{what}: the build is refused there without --allow-offload"]
    if allow_offload:
        return [f"{what}: --allow-offload: accelerate offloads the rest to host memory (slow)"]
    raise PreflightError(
        f"{what}; build on a node whose GPUs hold it (>= {gpus}x {gpu.name}: trt-spec build counts "
        f"the GPUs it sees; trt-spec plan --gpu {gpu.name}:{gpus}), use a pre-quantized FP8 checkpoint (no "
        "calibration), or pass --allow-offload to let accelerate offload the rest to host memory (hours, and "
        "ModelOpt's export of offloaded modules is fragile)"
    )


def _prequantized(
    cfg: BuildConfig, quant: QuantChoice, gpu: Optional[GpuSpec]
) -> tuple[dict[str, PreQuant], QuantChoice, list[str]]:
    """The engine path's ModelOpt pre-quantized checkpoints (role -> facts), the formats they fix, and warnings.

    Each is converted as it is (llama's convert_checkpoint.py --use_fp8, upstream-facts:
    trtllm-convert-prequantized-fp8), so quantization.weights must be its format; an FP8 KV cache needs its k/v scales
    (without them the converter silently uses scale 1.0: upstream-facts: trtllm-fp8-kv-scale-default)."""
    rec = cfg.recipe
    if not rec.gpu or rec.llm_api or "checkpoint" not in rec.steps:
        return {}, quant, []
    found: dict[str, PreQuant] = {}
    for role, model in (("target", cfg.target), ("draft", cfg.draft)):
        if model is not None and (p := prequant_for(model.checkpoint)) is not None:
            found[role] = p
    if not found:
        return {}, quant, []
    q, warnings = cfg.quantization, []
    kv = quant.kv_cache
    for role, p in found.items():
        where = f"{role}.checkpoint {getattr(cfg, role).checkpoint} is pre-quantized {p.quant_algo} ({p.source})"
        if p.quant_algo not in SERVED_ALGOS:
            raise PreflightError(
                f"{where}: the engine path converts pre-quantized {', '.join(SERVED_ALGOS)} checkpoints only; point "
                f"{role}.checkpoint at the 16-bit checkpoint (the build quantizes it) or use runtime: llmapi"
            )
        if q.weights not in ("auto", "fp8") or quant.fell_back:
            asked = "fp8 on a GPU without FP8 (fallback " + quant.weights + ")" if quant.fell_back else q.weights
            raise PreflightError(
                f"{where}, but quantization.weights is {asked}; set quantization.weights: fp8 (or auto) on an "
                f"FP8 GPU, or point {role}.checkpoint at the 16-bit checkpoint to quantize it to {quant.weights}"
            )
        if role == "target" and q.kv_cache == "auto":
            kv = "fp8" if p.kv_cache_quant_algo == "FP8" else "none"
            if not p.kv_known:
                warnings.append(
                    f"{role}: the KV cache follows the checkpoint's kv_cache_quant_algo, unknown here ({p.source}): "
                    "planned 16-bit; build reads it"
                )
        if kv == "int8" or (p.kv_cache_quant_algo not in (None, "FP8") and kv != "none"):
            raise PreflightError(
                f"{where} with KV cache {p.kv_cache_quant_algo or '16-bit'}, but quantization.kv_cache resolves to "
                f"{kv}: the converter takes no other KV format from it; set quantization.kv_cache: auto"
            )
        if kv == "fp8" and p.kv_known and p.kv_cache_quant_algo is None:
            raise PreflightError(
                f"{where} with kv_cache_quant_algo null (no k/v scales), but quantization.kv_cache is fp8: "
                "TensorRT-LLM's converter would build an FP8 KV cache with scale 1.0 (uncalibrated); "
                + (
                    "set quantization.kv_cache: auto (the checkpoint's 16-bit KV cache)"
                    if role == "target"
                    else "point draft.checkpoint at its 16-bit checkpoint (the build calibrates its FP8 KV cache)"
                )
                + " or use a checkpoint exported with an FP8 KV cache"
            )
        if kv == "fp8" and not p.kv_known:
            warnings.append(f"{role}: an FP8 KV cache needs the checkpoint's k/v scales ({p.source}); build checks")
    return found, QuantChoice(weights="fp8", kv_cache=kv), warnings


def run_preflight(
    cfg: BuildConfig,
    gpu: Optional[GpuSpec],
    *,
    require_checkpoints: bool,
    allow_offload: Optional[bool] = None,
    calibration_gpu: Optional[GpuSpec] = None,
) -> PreflightReport:
    """All checks, cheapest first; `require_checkpoints=False` tolerates absent checkpoints.

    allow_offload: False refuses a calibration that overflows the GPUs, True allows offload, None only warns.
    calibration_gpu: the GPUs quantize.py will see (None: `gpu`)."""
    rec = cfg.recipe
    if rec.gpu and gpu is None:
        raise PreflightError(
            "no GPU found (nvidia-smi absent); pass --gpu NAME (e.g. h100, h200, a100-80gb) or set gpu: in the config"
        )
    k_max = effective_max_draft_len(cfg)
    _check_speculative(cfg, k_max)
    quant, warnings = resolve_quantization(cfg, gpu)
    prequant, quant, pwarnings = _prequantized(cfg, quant, gpu)
    warnings += pwarnings
    _check_mode_quantization(cfg, quant)
    target, draft, notes = _model_facts(cfg, require_checkpoints)
    for role, info in (("target", target), ("draft", draft)):
        if role in prequant and TRTLLM_ARCHITECTURES.get(info.architecture) != "llama":
            raise PreflightError(
                f"{role}.checkpoint: a pre-quantized {info.architecture} checkpoint; trt-spec converts pre-quantized "
                "FP8 checkpoints with TensorRT-LLM's Llama converter only (Llama, Mistral, Mixtral); point "
                f"{role}.checkpoint at the 16-bit checkpoint (the build quantizes it)"
            )
        if role in prequant:
            notes.append(f"{role}: pre-quantized checkpoint, {prequant[role].describe()}: converted, not calibrated")
    head, lnotes, lwarnings = _runtime_checks(cfg, target, quant, require_checkpoints)
    notes += lnotes
    warnings += lwarnings
    _check_parallelism(cfg, target, draft)
    tnotes, twarnings = _check_draft_compat(cfg, target, draft)
    notes, warnings = notes + tnotes, warnings + twarnings
    if require_checkpoints:
        _check_heads(cfg)
    calibration, cnote = _calibration_set(cfg, quant, require_checkpoints, prequant)
    notes += cnote
    dev = _devices(cfg, head)
    memory: list[MemoryRow] = []
    kv_frac = cfg.serving.kv_cache_free_gpu_mem_fraction
    peaks: dict[str, dict] = {}
    if rec.gpu:
        memory, kv_frac, mnotes = _memory_plan(cfg, gpu, quant, target, draft, head, dev)
        notes += mnotes
        if "checkpoint" in rec.steps:  # quantize.py runs in the checkpoint step
            quantized = [(r, i) for r, i in (("target", target), ("draft", draft)) if i and r not in prequant]
            warnings += _check_calibration_fits(cfg, quant, quantized, calibration_gpu or gpu, allow_offload)
            peaks = _calibration_estimates(cfg, quant, quantized, (calibration_gpu or gpu).count)
        notes += _serving_notes(cfg, target)
    else:
        kv_frac = kv_frac or DEFAULT_KV_FRACTION
    return PreflightReport(
        cfg,
        gpu,
        target,
        draft,
        quant,
        dev.target,
        dev.draft,
        kv_frac,
        k_max,
        dev.draft_kv,
        memory,
        warnings,
        notes,
        head=head,
        calibration=calibration,
        prequantized=prequant,
        calibration_peaks=peaks,
    )


def _calibration_estimates(
    cfg: BuildConfig, quant: QuantChoice, models: list[tuple[str, ModelInfo]], gpus: int
) -> dict[str, dict]:
    """Per quantized role, the GiB calibration_peak estimates: what the smoke report sets beside the measured peak."""
    if not quantizes(cfg.engine, cfg.runtime, quant.weights):
        return {}
    out = {}
    for role, info in models:
        peak = calibration_peak(info, CALIB_BATCH_SIZE, cfg.quantization.calib_max_seq_length)
        out[role] = {"floor_gib": round(peak.floor_gib, 3), "ceiling_gib": round(peak.ceiling_gib(gpus), 3)}
    return out


def _check_mode_quantization(cfg: BuildConfig, quant: QuantChoice) -> None:
    """What a mode's engine takes of the resolved formats (TensorRT-LLM 1.2)."""
    if cfg.speculative.mode is Mode.EAGLE and cfg.recipe.gpu and quant.weights not in ("bf16", "fp16"):
        raise PreflightError(
            f"EAGLE engines are FP16/BF16 only in TensorRT-LLM 1.2 (got {quant.weights}); "
            "set quantization.weights: bf16"
        )
    if cfg.speculative.mode is Mode.MEDUSA and cfg.speculative.use_draft_logits:
        raise PreflightError("Medusa is greedy-only in TensorRT-LLM; remove use_draft_logits")


def _distilled_draft(target: ModelInfo, d) -> ModelInfo:
    """The facts of a draft distilled at build time."""
    return ModelInfo(
        **{
            **target.__dict__,
            "num_layers": d.num_layers,
            "hidden_size": d.hidden_size,
            "num_heads": max(1, d.hidden_size // 64),
            "num_kv_heads": 1,  # distill.DistillConfig
            "intermediate_size": d.hidden_size * 4,
            "tie_word_embeddings": True,
            "source": "distilled from the target at build time (same tokenizer by construction)",
        }
    )


def _architectures(cfg: BuildConfig) -> tuple[set[str], str]:
    """The architectures the config's engine builds, and the engine's name for errors."""
    rec = cfg.recipe
    if not rec.gpu:
        return set(REFERENCE_ARCHITECTURES), "the reference engine"
    allowed = set(TRTLLM_ARCHITECTURES)
    if rec.llm_api:
        allowed |= set(EAGLE3_SUPPORT) | set(MTP_ARCHITECTURES)  # the PyTorch path serves these too
    return allowed, "TensorRT-LLM 1.2's engine flow"


def _model_facts(cfg: BuildConfig, require: bool) -> tuple[ModelInfo, Optional[ModelInfo], list[str]]:
    """The target's and draft's facts, checked against the engine and max_seq_len. Returns (target, draft, notes)."""
    target = model_info_for(cfg.target.checkpoint, "target", require)
    draft = None
    if cfg.draft is not None and cfg.draft.distill is not None:
        draft = _distilled_draft(target, cfg.draft.distill)
    elif cfg.draft is not None:
        draft = model_info_for(cfg.draft.checkpoint, "draft", require)
    _check_imported_sources(cfg, target, require)
    notes = []
    allowed, what = _architectures(cfg)
    for role, info in (("target", target), ("draft", draft)):
        if info is None:
            continue
        if info.source != "checkpoint":
            notes.append(f"{role}: {info.source}")
        if info.architecture not in allowed:
            raise PreflightError(
                f"{role}: architecture {info.architecture} is not one {what} builds; supported: "
                f"{', '.join(sorted(allowed))}"
            )
        if info.max_position_embeddings and cfg.limits.max_seq_len > info.max_position_embeddings:
            raise PreflightError(
                f"limits.max_seq_len {cfg.limits.max_seq_len} exceeds {role}'s max_position_embeddings "
                f"{info.max_position_embeddings}; lower limits.max_seq_len"
            )
    return target, draft, notes


def _runtime_checks(
    cfg: BuildConfig, target: ModelInfo, quant: QuantChoice, require: bool
) -> tuple[Optional[ModelInfo], list[str], list[str]]:
    """The recipe is served, and the LLM API's GPU checks. Returns (EAGLE-3 head, notes, warnings)."""
    try:
        rec = recipe(cfg.runtime, cfg.engine, cfg.speculative.mode)
    except RecipeError as e:
        raise PreflightError(str(e)) from None
    if not (rec.llm_api and rec.gpu):
        return None, [], []
    head, notes = _llmapi_checks(cfg, target, require)
    s = cfg.speculative
    risky = s.mode is Mode.EAGLE3 and s.eagle3.one_model and quant.kv_cache == "fp8"
    return head, notes, [EAGLE3_FP8_KV_RISK] if risky else []


def _check_parallelism(cfg: BuildConfig, target: ModelInfo, draft: Optional[ModelInfo]) -> None:
    if cfg.recipe.gpu:
        _check_parallel("target", cfg.target.tp, cfg.target.pp, target)
        if draft is not None:
            _check_parallel("draft", cfg.draft.tp, cfg.draft.pp, draft)
    elif cfg.target.world_size > 1 or (cfg.draft and cfg.draft.world_size > 1):
        raise PreflightError("the reference engine runs on one CPU process; set target.tp/pp and draft.tp/pp to 1")


def _check_draft_compat(cfg: BuildConfig, target: ModelInfo, draft: Optional[ModelInfo]) -> tuple[list[str], list[str]]:
    """The draft shares the target's vocabulary. Returns (notes, warnings)."""
    notes: list[str] = []
    warnings: list[str] = []
    if draft is not None and cfg.speculative.use_draft_logits and draft.vocab_size != target.vocab_size:
        raise PreflightError(
            f"speculative.use_draft_logits with different vocab sizes (target {target.vocab_size}, draft "
            f"{draft.vocab_size}): the draft's logits would be {draft.vocab_size} wide where the target expects "
            f"{target.vocab_size}; set use_draft_logits: false (greedy and token-matching acceptance need no logits)"
        )
    if draft is not None and cfg.draft.checkpoint is not None:
        tdir, ddir = Path(cfg.target.checkpoint), Path(cfg.draft.checkpoint)
        if tdir.is_dir() and ddir.is_dir():
            notes += check_tokenizers(tdir, ddir, target, draft)
        else:
            if target.vocab_size != draft.vocab_size:
                notes.append(f"vocab padding: target {target.vocab_size} vs draft {draft.vocab_size} rows")
            warnings.append("tokenizer compatibility not checked: checkpoints not on this machine (checked by build)")
    return notes, warnings


def _check_heads(cfg: BuildConfig) -> None:
    """The mode's head checkpoint is one (checkpoints on this machine only)."""
    s = cfg.speculative
    for spec_name in ("medusa", "eagle"):
        spec = getattr(s, spec_name)
        if s.mode == spec_name and spec.heads_dir and not (Path(spec.heads_dir) / "config.json").is_file():
            raise PreflightError(
                f"speculative.{spec_name}.heads_dir {spec.heads_dir}: no config.json; point it at "
                f"the {spec_name} heads checkpoint"
            )
    eg = s.eagle
    if not cfg.recipe.gpu and s.mode is Mode.EAGLE and eg.heads_dir:
        arch = json.loads((Path(eg.heads_dir) / "config.json").read_text()).get("architectures") or []
        if "LlamaForCausalLMEagle3" not in arch:
            raise PreflightError(
                f"speculative.eagle.heads_dir {eg.heads_dir}: architectures {arch} is not an "
                "EAGLE-3 head (LlamaForCausalLMEagle3), which the reference engine drafts with; "
                "point it at one, or use speculative.eagle.train to train one at build time"
            )


@dataclass(frozen=True)
class _Devices:
    target: list[int]
    draft: list[int]
    draft_kv: Optional[int]  # max_tokens_in_paged_kv_cache of an engine sharing the target's GPUs


def _devices(cfg: BuildConfig, head: Optional[ModelInfo]) -> _Devices:
    """The target's and draft's GPUs, and the KV-cache cap of an engine sharing them."""
    # Cap the draft at max_batch_size full sequences, or a draft that loads first takes most of the GPU.
    baseline = cfg.speculative.has_baseline_engine
    draft_kv = (
        -(-cfg.limits.max_batch_size * cfg.limits.max_seq_len // TOKENS_PER_BLOCK) * TOKENS_PER_BLOCK
        if cfg.draft is not None or baseline
        else None
    )
    t_dev = cfg.serving.gpu_device_ids or list(range(cfg.target.world_size))
    d_dev: list[int] = []
    if cfg.draft is not None:
        d_dev = cfg.serving.draft_gpu_device_ids or t_dev[: cfg.draft.world_size]
    if cfg.recipe.llm_api and (cfg.draft is not None or head is not None):
        d_dev = list(t_dev)  # the LLM API loads the draft or head in the target's process
    return _Devices(t_dev, d_dev, draft_kv)


def _memory_plan(
    cfg: BuildConfig,
    gpu: GpuSpec,
    quant: QuantChoice,
    target: ModelInfo,
    draft: Optional[ModelInfo],
    head: Optional[ModelInfo],
    dev: _Devices,
) -> tuple[list[MemoryRow], float, list[str]]:
    """Every GPU holds what loads on it. Returns (rows, the target's KV-cache fraction, notes)."""
    t_dev, d_dev, notes = dev.target, dev.draft, []
    if len(t_dev) != cfg.target.world_size:
        raise PreflightError(
            f"runtime.gpu_device_ids has {len(t_dev)} ids but the target needs tp*pp = "
            f"{cfg.target.world_size}; list exactly {cfg.target.world_size} ids"
        )
    if cfg.draft is not None and len(d_dev) != cfg.draft.world_size:
        raise PreflightError(
            f"runtime.draft_gpu_device_ids has {len(d_dev)} ids but the draft needs tp*pp = "
            f"{cfg.draft.world_size}; list exactly {cfg.draft.world_size} ids"
        )
    used = sorted(set(t_dev) | set(d_dev))
    if used and max(used) >= gpu.count:
        raise PreflightError(
            f"GPU ids {used} need {max(used) + 1} GPUs but {gpu.describe()}; lower tp or use a "
            "bigger node (--gpu NAME:COUNT)"
        )
    baseline = cfg.speculative.has_baseline_engine
    memory = _memory_rows(cfg, quant, target, draft, head, dev)
    if baseline:
        notes.append(
            f"{cfg.speculative.mode} speculates inside the target engine, so the baseline (the ensemble's "
            f"engine) is a second, non-speculative engine of the target on GPU(s) {t_dev}"
        )
    kv_frac = cfg.serving.kv_cache_free_gpu_mem_fraction
    if kv_frac is None:
        kv_frac = DEFAULT_KV_FRACTION
        shares = bool(set(t_dev) & set(d_dev))
        # llmapi: one process, one KV cache pool
        if (shares or baseline) and not cfg.recipe.llm_api:
            kv_frac = shared_gpu_kv_fraction(memory, gpu.memory_gib)
            who = "draft" if shares else "baseline"
            where = sorted(set(t_dev) & set(d_dev)) if shares else t_dev
            notes.append(
                f"{who} and target share GPU(s) {where}: the {who}'s KV cache is capped at {dev.draft_kv:,} "
                f"tokens (max_tokens_in_paged_kv_cache) and the target takes {kv_frac} of the memory left "
                "free (kv_cache_free_gpu_mem_fraction), so whichever loads first leaves room for the other"
            )
    _check_fits(memory, gpu, baseline)
    return memory, kv_frac, notes


def _memory_rows(
    cfg: BuildConfig,
    quant: QuantChoice,
    target: ModelInfo,
    draft: Optional[ModelInfo],
    head: Optional[ModelInfo],
    dev: _Devices,
) -> list[MemoryRow]:
    """One row per model per GPU."""
    t_dev, d_dev = dev.target, dev.draft
    sizing = (cfg.limits, cfg.serving.memory_reserve_gib)
    memory = memory_rows("target", target, quant.weights, quant.kv_cache, cfg.target.tp, cfg.target.pp, t_dev, *sizing)
    spec_weights = LLMAPI_SPEC_MODEL_WEIGHTS if cfg.recipe.llm_api else quant.weights
    if draft is not None:
        memory += memory_rows("draft", draft, spec_weights, quant.kv_cache, cfg.draft.tp, cfg.draft.pp, d_dev, *sizing)
    if head is not None:  # on the target's GPUs, with its own KV cache
        memory += memory_rows("draft", head, spec_weights, quant.kv_cache, cfg.target.tp, cfg.target.pp, d_dev, *sizing)
    if cfg.speculative.has_baseline_engine:  # the target's weights again
        memory += memory_rows(
            "baseline", target, quant.weights, quant.kv_cache, cfg.target.tp, cfg.target.pp, t_dev, *sizing
        )
    return memory


def _check_fits(memory: list[MemoryRow], gpu: GpuSpec, baseline: bool) -> None:
    for gid, total in sorted(totals_per_gpu(memory).items()):
        if total > gpu.memory_gib:
            parts = ", ".join(
                f"{r.role} weights {r.weights_gib:.1f} + KV {r.kv_gib:.1f} + reserve {r.reserve_gib:.1f}"
                for r in memory
                if r.gpu_id == gid
            )
            raise PreflightError(
                f"GPU {gid} ({gpu.name}, {gpu.memory_gib:.1f} GiB) needs {total:.1f} GiB ({parts}); lower "
                "limits.max_batch_size or limits.max_seq_len, raise tp, use FP8/INT8 KV cache, or "
                + (
                    "drop the baseline engine (speculative.baseline_engine: false; check and bench then have no "
                    "baseline)"
                    if baseline
                    else "move the draft to another GPU (runtime.draft_gpu_device_ids)"
                )
            )


def _serving_notes(cfg: BuildConfig, target: ModelInfo) -> list[str]:
    """What the GPU deployment serves differently from what the config might suggest."""
    notes = []
    if cfg.speculative.mode is Mode.MEDUSA:
        notes.append("Medusa decoding is greedy only (temperature is ignored by the engine)")
    baseline = cfg.speculative.has_baseline_engine
    if not cfg.recipe.llm_api and (baseline or not cfg.speculative.mode.in_engine):  # plan.baseline_role
        logits_gib = generation_logits_cache_bytes(cfg.limits.max_batch_size, target.vocab_size) / GIB
        notes.append(
            f"the {'baseline' if baseline else 'target'} engine serves the baseline and is built with "
            f"--gather_generation_logits (check reads its top-2 margin at a divergence): ~{logits_gib:.2f} "
            f"GiB of logits buffers per GPU at load, counted in the reserve "
            f"({cfg.serving.memory_reserve_gib} GiB), not as a row"
        )
    return notes
