"""Pre-quantized ModelOpt checkpoints: read offline from hf_quant_config.json or config.json's quantization_config.

A ModelOpt FP8 export carries float8_e4m3fn weights with per-tensor `weight_scale` and `input_scale` (and, with a
calibrated FP8 KV cache, `k_proj.k_scale` / `v_proj.v_scale`); TensorRT-LLM's Llama converter loads those scales as
they are, so the build runs no calibration (upstream-facts: trtllm-convert-prequantized-fp8).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from .model_info import PreflightError, is_imported

HF_QUANT_CONFIG = "hf_quant_config.json"  # ModelOpt's Hugging Face export writes it beside config.json
SERVED_ALGOS = ("FP8",)  # the quant_algo the engine path converts without calibrating


@dataclass(frozen=True)
class PreQuant:
    """What a pre-quantized checkpoint carries. kv_cache_quant_algo None: a 16-bit KV cache (no k/v scales)."""

    quant_algo: str  # ModelOpt's name: FP8, NVFP4, W4A16_AWQ, ...
    kv_cache_quant_algo: Optional[str]
    source: str  # where it was read
    kv_known: bool = True  # False: from the built-in table, which does not record the KV cache's format

    def describe(self) -> str:
        kv = (self.kv_cache_quant_algo or "16-bit") if self.kv_known else "unknown until build"
        return f"{self.quant_algo} weights, KV cache {kv} ({self.source})"


# Published checkpoints the shipped configs name, so `trt-spec plan` knows them without the files.
KNOWN_PREQUANTIZED: dict[str, PreQuant] = {
    "llama-3.3-70b-instruct-fp8": PreQuant("FP8", None, "built-in table; build reads hf_quant_config.json", False),
}


def _algo(v) -> Optional[str]:
    return str(v).upper() if v not in (None, "", "null") else None


def read_prequant(checkpoint: Path) -> Optional[PreQuant]:
    """A ModelOpt checkpoint's quantization, from hf_quant_config.json, else config.json's quantization_config with
    quant_method "modelopt"; None when the directory holds neither (an unquantized or non-ModelOpt checkpoint)."""
    f = checkpoint / HF_QUANT_CONFIG
    if f.is_file():
        try:
            q = json.loads(f.read_text()).get("quantization") or {}
        except (OSError, ValueError, AttributeError) as e:
            raise PreflightError(f"{f}: unreadable ({e}); re-download the checkpoint") from None
        algo = _algo(q.get("quant_algo"))
        if algo is None:
            raise PreflightError(f"{f}: no quantization.quant_algo; re-download the checkpoint or remove the file")
        return PreQuant(algo, _algo(q.get("kv_cache_quant_algo")), HF_QUANT_CONFIG)
    c = checkpoint / "config.json"
    if not c.is_file():
        return None
    try:
        q = json.loads(c.read_text()).get("quantization_config") or {}
    except (OSError, ValueError, AttributeError):
        return None  # model_info reports an unreadable config.json
    if str(q.get("quant_method", "")).lower() != "modelopt" or not q.get("quant_algo"):
        return None
    return PreQuant(_algo(q["quant_algo"]), _algo(q.get("kv_cache_quant_algo")), "config.json quantization_config")


def prequant_for(checkpoint: Optional[str]) -> Optional[PreQuant]:
    """The checkpoint's own files when present; else (plan only) the built-in table; None when unquantized."""
    if checkpoint is None or is_imported(checkpoint):
        return None
    path = Path(checkpoint)
    if path.is_dir():
        return read_prequant(path)
    return KNOWN_PREQUANTIZED.get(path.name.lower())
