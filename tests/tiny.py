"""Tiny real models for tests: a byte-level BPE tokenizer trained in-process and random Llama weights."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

CORPUS = [
    "def add(a, b):\n    return a + b\n",
    "class Stack:\n    def push(self, x):\n        self.items.append(x)\n",
    "The quick brown fox jumps over the lazy dog.",
    "Speculative decoding keeps the target's output.",
    "import numpy as np\nx = np.arange(10)\nprint(x.sum())\n",
    "for i in range(10):\n    print(i)\n",
    "Hello, world! What is the capital of France? Paris is the capital.",
] * 20
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]  # ids 0, 1, 2 like SmolLM2


def make_tokenizer(out: Path, vocab_size: int = 384) -> Path:
    """A byte-level BPE tokenizer (any text round-trips) saved as a Hugging Face fast tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
        unk_token="<|endoftext|>",
        pad_token="<|im_end|>",
    )
    out.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(out)
    return out


def make_model(
    out: Path,
    tokenizer_dir: Path,
    *,
    seed: int = 0,
    hidden: int = 64,
    layers: int = 2,
    vocab_size: int = 384,
    copy_from: Path | None = None,
    tie: bool = False,
) -> Path:
    """A random (or copied) LlamaForCausalLM + the tokenizer, as a Hugging Face directory. Untied by default:
    a tied random model mostly predicts its input token, so any two of them would agree."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    out.mkdir(parents=True, exist_ok=True)
    if copy_from is not None:
        for f in copy_from.iterdir():
            if f.is_file():
                shutil.copy2(f, out / f.name)
        return out
    torch.manual_seed(seed)
    cfg = LlamaConfig(
        hidden_size=hidden,
        intermediate_size=hidden * 2,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=vocab_size,
        max_position_embeddings=1024,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
        tie_word_embeddings=tie,
    )
    model = LlamaForCausalLM(cfg)
    with torch.no_grad():  # logits of a real LM's scale (margins O(1), not O(0.01))
        model.model.embed_tokens.weight.mul_(4.0)
        if not tie:
            model.lm_head.weight.mul_(60.0)
    model.save_pretrained(out)
    for f in tokenizer_dir.iterdir():
        shutil.copy2(f, out / f.name)
    cfgj = json.loads((out / "config.json").read_text())
    assert cfgj["vocab_size"] == vocab_size
    return out
