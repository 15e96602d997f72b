"""Tiny random HF checkpoints for the reference-engine tests (built here, offline, deterministic).

torch / transformers are imported lazily so that this conftest never affects tests that do not use them.
"""

from __future__ import annotations

import pytest

TINY = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=128,
    bos_token_id=None,
    eos_token_id=None,  # generation length is controlled by the tests
    pad_token_id=None,
)
LLAMA3_ROPE = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 16,
}
# kind -> (HF config class, extra config)
KINDS = {
    "llama": ("LlamaConfig", {}),
    "qwen2": ("Qwen2Config", {}),  # q/k/v biases
    "llama_tied_rope3": ("LlamaConfig", {"tie_word_embeddings": True, "rope_scaling": LLAMA3_ROPE}),
    "mistral_window": ("MistralConfig", {"sliding_window": 6}),
    "llama_bias": ("LlamaConfig", {"attention_bias": True, "mlp_bias": True}),  # every projection has a bias
}


def randomize(model, seed: int, std: float = 0.1) -> None:
    """Re-draw every parameter (biases and norms too, so those code paths matter)."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen)
            p.copy_(1 + 0.1 * noise if "norm" in name else std * noise)


def build_hf(kind: str, seed: int):
    import transformers

    config_cls, extra = KINDS[kind]
    config = getattr(transformers, config_cls)(**TINY, **extra)
    model_cls = getattr(transformers, config_cls.replace("Config", "ForCausalLM"))
    model = model_cls(config).eval()
    randomize(model, seed)
    return model


@pytest.fixture
def one_thread():
    """Tiny models are dominated by per-op overhead; extra threads only add synchronisation (and stalls on a
    shared machine)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory):
    """name -> (HF model, saved directory); 'llama_draft' is a llama with different weights."""
    out = {}
    for seed, (name, kind) in enumerate([*((k, k) for k in KINDS), ("llama_draft", "llama")]):
        model = build_hf(kind, seed)
        path = tmp_path_factory.mktemp(name)
        model.save_pretrained(path)
        out[name] = (model, path)
    return out


@pytest.fixture(scope="session")
def target(checkpoints):
    from trt_spec.reference.model import ReferenceModel

    return ReferenceModel.from_pretrained(checkpoints["llama"][1])


@pytest.fixture(scope="session")
def random_draft(checkpoints):
    from trt_spec.reference.model import ReferenceModel

    return ReferenceModel.from_pretrained(checkpoints["llama_draft"][1])


@pytest.fixture(scope="session")
def close_draft(checkpoints):
    """The target with slightly perturbed weights: agrees with it often but not always."""
    import torch

    from trt_spec.reference.model import ReferenceModel

    hf = checkpoints["llama"][0]
    gen = torch.Generator().manual_seed(99)
    state = {k: v + 0.006 * torch.randn(v.shape, generator=gen) for k, v in hf.state_dict().items()}
    return ReferenceModel.from_state_dict(hf.config.to_dict(), state)


@pytest.fixture(scope="module")
def sharp_model():
    """A 2-layer Llama with its LM head scaled up: logits of a real LM's scale (greedy margins O(1)), so greedy
    comparisons are not decided by rounding."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from trt_spec.reference.model import ReferenceModel

    torch.manual_seed(0)
    cfg = LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=128,
        tie_word_embeddings=False,
    )
    hf = LlamaForCausalLM(cfg)
    with torch.no_grad():
        hf.lm_head.weight.mul_(30)
    return ReferenceModel.from_state_dict(cfg.to_dict(), hf.state_dict())
