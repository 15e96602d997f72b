"""The kernel twin: a tiny random-weight Llama with Llama-3.3-70B's attention and vocabulary shape.

head_dim 128, GQA 8:1 (16 query / 2 KV heads: TP2 leaves each rank 8:1, as the 70B on TP8), vocabulary 128256 with
Llama 3's special ids, Llama 3 RoPE; 2 layers and a small FFN, so FP8 quantize + trtllm-build + serve take minutes
and hit the same attention kernels (FP8 context FMHA, paged KV) as the 70B. Its draft: 1 layer, same vocabulary.
Greedy identity holds for any weights, so random ones prove the serving path.

The tokenizer is trt-spec's own, not SmolLM2's (49152 entries): a random model emits any id below 128256, and every
one must detokenize. Byte-level with no merges: each of the 256 byte symbols is one token (any text round-trips),
ids 256..127999 are plain filler tokens that decode to their own text, 128000..128255 Llama 3's special tokens.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ..records.models import ModelInfo

NAME = "kernel-twin-llama70b-shape"
TARGET_DIR = f"{NAME}-target"  # the directory names are the built-in model table's keys (plan without checkpoints)
DRAFT_DIR = f"{NAME}-draft"
OUT_DIR = "build/kernel-twin"  # build_configs/kernel-twin-llama70b-shape*.yaml point here
VOCAB = 128256
BOS, EOS, EOT = 128000, 128001, 128009  # Llama 3: <|begin_of_text|>, <|end_of_text|>, <|eot_id|>
CONTEXT = 131072
ROPE = {"rope_theta": 500000.0, "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}}  # fmt: skip
# architecture, layers, hidden, heads, KV heads, head dim, FFN, vocab, tied, context
TARGET = ModelInfo("LlamaForCausalLM", 2, 2048, 16, 2, 128, 1024, VOCAB, False, CONTEXT,
                   bos_token_id=BOS, eos_token_ids=(EOS, EOT))  # fmt: skip
DRAFT = ModelInfo("LlamaForCausalLM", 1, 1024, 8, 1, 128, 512, VOCAB, True, CONTEXT,
                  bos_token_id=BOS, eos_token_ids=(EOS, EOT))  # fmt: skip
LOGIT_STD = 10.0  # logits of a real LM's spread, so greedy margins are O(1) and FP8 rounding rarely flips argmax
MARKER = "trt_spec_kernel_twin.json"


def special_tokens() -> dict[int, str]:
    """Llama 3's special tokens by id (its tokenizer_config's names)."""
    named = {128000: "<|begin_of_text|>", 128001: "<|end_of_text|>", 128006: "<|start_header_id|>",
             128007: "<|end_header_id|>", 128008: "<|eom_id|>", 128009: "<|eot_id|>"}  # fmt: skip
    reserved = (i for i in range(BOS, VOCAB) if i not in named)
    return named | {i: f"<|reserved_special_token_{n}|>" for n, i in enumerate(reserved)}


def make_tokenizer(out: Path, vocab_size: int = VOCAB):
    """Write the byte-level tokenizer (tokenizer.json + tokenizer_config.json) to `out`; returns it."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = special_tokens()
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {ch: i for i, ch in enumerate(alphabet)}
    vocab |= {f"<|filler_{i}|>": i for i in range(len(vocab), BOS)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(specials[i], special=True, normalized=False) for i in range(BOS, vocab_size)])
    if tok.get_vocab_size() != vocab_size:
        raise AssertionError(f"kernel twin tokenizer has {tok.get_vocab_size()} entries, not {vocab_size}")
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=specials[BOS], eos_token=specials[EOT], pad_token=specials[EOS]
    )
    out.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(out)
    return fast


def hf_config(info: ModelInfo) -> dict:
    return {
        "architectures": [info.architecture],
        "model_type": "llama",
        "hidden_size": info.hidden_size,
        "intermediate_size": info.intermediate_size,
        "num_hidden_layers": info.num_layers,
        "num_attention_heads": info.num_heads,
        "num_key_value_heads": info.num_kv_heads,
        "head_dim": info.head_dim,
        "vocab_size": info.vocab_size,
        "tie_word_embeddings": info.tie_word_embeddings,
        "max_position_embeddings": info.max_position_embeddings,
        "bos_token_id": info.bos_token_id,
        "eos_token_id": list(info.eos_token_ids),
        "hidden_act": "silu",
        "rms_norm_eps": 1e-5,
        "attention_bias": False,
        "mlp_bias": False,
        "torch_dtype": "bfloat16",
        **ROPE,
    }


def write_model(out: Path, info: ModelInfo, seed: int, tokenizer_dir: Path) -> None:
    """Random bf16 weights under Hugging Face Llama's names, config.json, the tokenizer's files."""
    import shutil

    import torch
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(seed)
    h, q, kv, f = (
        info.hidden_size,
        info.num_heads * info.head_dim,
        info.num_kv_heads * info.head_dim,
        info.intermediate_size,
    )

    def randn(*shape: int, std: float = 0.02) -> torch.Tensor:
        return (torch.randn(*shape, generator=g) * std).to(torch.bfloat16)

    w = {"model.embed_tokens.weight": randn(info.vocab_size, h, std=1.0), "model.norm.weight": torch.ones(h).bfloat16()}
    for i in range(info.num_layers):
        p = f"model.layers.{i}."
        w |= {
            p + "input_layernorm.weight": torch.ones(h).bfloat16(),
            p + "post_attention_layernorm.weight": torch.ones(h).bfloat16(),
            p + "self_attn.q_proj.weight": randn(q, h),
            p + "self_attn.k_proj.weight": randn(kv, h),
            p + "self_attn.v_proj.weight": randn(kv, h),
            p + "self_attn.o_proj.weight": randn(h, q),
            p + "mlp.gate_proj.weight": randn(f, h),
            p + "mlp.up_proj.weight": randn(f, h),
            p + "mlp.down_proj.weight": randn(h, f),
        }
    if not info.tie_word_embeddings:
        w["lm_head.weight"] = randn(info.vocab_size, h, std=LOGIT_STD / h**0.5)
    out.mkdir(parents=True, exist_ok=True)
    save_file(w, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(hf_config(info), indent=2) + "\n")
    (out / "generation_config.json").write_text(
        json.dumps({"bos_token_id": BOS, "eos_token_id": [EOS, EOT], "do_sample": False}, indent=2) + "\n"
    )
    for t in tokenizer_dir.iterdir():
        shutil.copy2(t, out / t.name)


def write_twin(out: Path, target: ModelInfo = TARGET, draft: ModelInfo = DRAFT) -> dict:
    """out/TARGET_DIR and out/DRAFT_DIR; skipped when out's marker records the same shapes. Returns the marker."""
    spec = {"target": hf_config(target), "draft": hf_config(draft), "seeds": [0, 1]}
    marker = out / MARKER
    if marker.is_file() and json.loads(marker.read_text()) == spec:
        return spec
    tok = out / "tokenizer"
    make_tokenizer(tok, target.vocab_size)
    write_model(out / TARGET_DIR, target, 0, tok)
    write_model(out / DRAFT_DIR, draft, 1, tok)
    marker.write_text(json.dumps(spec, indent=2) + "\n")
    return spec


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=OUT_DIR, help="writes OUT/%s and OUT/%s" % (TARGET_DIR, DRAFT_DIR))
    a = ap.parse_args(argv)
    write_twin(Path(a.out))
    print(f"kernel twin: {Path(a.out) / TARGET_DIR} and {Path(a.out) / DRAFT_DIR}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
