"""Model facts, offline: a checkpoint's dimensions and special tokens, its vocabulary, and a table of known models.

A missing or unreadable file raises PreflightError.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

from ..errors import TrtSpecError
from ..records.models import ModelInfo
from ..reference import kernel_twin as _kt


class PreflightError(TrtSpecError, ValueError):
    """A check failed: one line naming the problem and the fix."""


# Published config.json values of the models shipped configs name, so `trt-spec plan` works without the checkpoints.
_LLAMA_33_70B = ModelInfo("LlamaForCausalLM", 80, 8192, 64, 8, 128, 28672, 128256, False, 131072,
                          bos_token_id=128000, eos_token_ids=(128001, 128008, 128009))  # fmt: skip
# fmt: off
# one row per model: architecture, layers, hidden, heads, KV heads, head dim, FFN, vocab, tied embeddings, context
KNOWN_MODELS: dict[str, ModelInfo] = {
    "llama-3.3-70b-instruct": _LLAMA_33_70B,
    "llama-3.3-70b-instruct-fp8": _LLAMA_33_70B,
    "llama-3.1-70b-instruct": _LLAMA_33_70B,  # Llama 3.3 70B has Llama 3.1 70B's dimensions
    "llama-3.1-405b-instruct": ModelInfo("LlamaForCausalLM", 126, 16384, 128, 8, 128, 53248, 128256, False, 131072,
                                         bos_token_id=128000, eos_token_ids=(128001, 128008, 128009)),
    "llama-3.2-3b-instruct": ModelInfo("LlamaForCausalLM", 28, 3072, 24, 8, 128, 8192, 128256, True, 131072,
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
    # 256 routed + 1 shared expert (3 dense layers counted as MoE: within 2%); KV = kv_lora_rank 512 + rope dim 64.
    "deepseek-v3": ModelInfo("DeepseekV3ForCausalLM", 61, 7168, 128, 128, 128, 2048, 129280, False, 163840,
                             num_experts=257, bos_token_id=0, eos_token_ids=(1,), kv_latent_dim=576),
    # trt-spec's own tiny 70B-shaped pair, written by `make gpu-smoke` (trt_spec/reference/kernel_twin.py)
    _kt.TARGET_DIR: _kt.TARGET,
    _kt.DRAFT_DIR: _kt.DRAFT,
    "vicuna-7b-v1.3": ModelInfo("LlamaForCausalLM", 32, 4096, 32, 32, 128, 11008, 32000, False, 2048,
                                bos_token_id=1, eos_token_ids=(2,)),
}
# fmt: on


def _token_id(v) -> Optional[int]:
    """A config.json token id as one int (some checkpoints give a list: its first), for the typed manifest."""
    if isinstance(v, list):
        v = v[0] if v else None
    return None if v is None else int(v)


def _first(d: dict, *keys, default=None):
    for k in keys:
        if d.get(k) is not None:
            return d[k]
    return default


def read_model_info(checkpoint: Path, role: str) -> ModelInfo:
    cfg_path = checkpoint / "config.json"
    if not checkpoint.is_dir():
        raise PreflightError(
            f"{role}.checkpoint {checkpoint}: directory not found; download the Hugging Face "
            f"checkpoint there or point {role}.checkpoint at it (--set {role}.checkpoint=DIR)"
        )
    if not cfg_path.is_file():
        raise PreflightError(
            f"{role}.checkpoint {checkpoint}: no config.json; point {role}.checkpoint at a "
            "Hugging Face model directory (the one with config.json and *.safetensors)"
        )
    try:
        c = json.loads(cfg_path.read_text())
    except json.JSONDecodeError as e:
        raise PreflightError(
            f"{cfg_path}: invalid JSON ({e.msg} at line {e.lineno}); re-download the checkpoint"
        ) from None
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
            kv_latent_dim=int(c.get("kv_lora_rank") or 0) + int(c.get("qk_rope_head_dim") or 0)
            if c.get("kv_lora_rank")
            else 0,
            bos_token_id=_token_id(c.get("bos_token_id")),
            eos_token_ids=tuple(eos) if isinstance(eos, list) else ((eos,) if eos is not None else ()),
        )
    except (KeyError, TypeError, ValueError) as e:
        raise PreflightError(f"{cfg_path}: missing or invalid field {e}; re-download the checkpoint") from None


def _packaged_model_info(spec: str, role: str, require: bool) -> ModelInfo:
    """A GGUF file (pkg:<module>/<file>.gguf or a path): dimensions from the built-in table by model name."""
    from ..reference.checkpoints import SourceError, is_package_source, resolve_package_file

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
        raise PreflightError(
            f"{role}.checkpoint {spec}: GGUF model {key!r} is not in the built-in model table; "
            "convert it to a Hugging Face directory and point the checkpoint there"
        )
    return ModelInfo(
        **{**known.__dict__, "source": "model dimensions from the built-in table (GGUF source, imported at build time)"}
    )


def is_imported(checkpoint: str) -> bool:
    """A GGUF source, which the plan's import step converts to a Hugging Face directory."""
    return checkpoint.startswith("pkg:") or checkpoint.endswith(".gguf")


def model_info_for(checkpoint: str, role: str, require: bool) -> ModelInfo:
    """Real config.json when present; else (plan only) the built-in table of known models."""
    if is_imported(checkpoint):
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
    return ModelInfo(
        **{**known.__dict__, "source": "model dimensions from the built-in table (checkpoint not on this machine)"}
    )


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
