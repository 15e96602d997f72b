"""FP8 export round trip: shapes, dtypes, per-channel scales, dequantized error bound, engine loading."""

import json

import pytest
import torch

from trt_spec.reference.export import (
    ENGINE_META,
    FP8_MAX,
    dequantize_fp8,
    export,
    load_engine_state_dict,
    quantize_fp8,
    read_engine_meta,
)
from trt_spec.reference.model import ReferenceModel


@pytest.fixture(scope="module")
def tiny_hf(tmp_path_factory):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=96,
        tie_word_embeddings=False,
        max_position_embeddings=256,
    )
    d = tmp_path_factory.mktemp("hf")
    LlamaForCausalLM(cfg).save_pretrained(d)
    return d


def test_quantize_fp8_per_channel():
    torch.manual_seed(1)
    w = torch.randn(32, 48) * torch.logspace(-3, 1, 32)[:, None]  # rows of very different magnitude
    q, scale = quantize_fp8(w)
    assert q.dtype == torch.float8_e4m3fn and q.shape == w.shape
    assert scale.shape == (32,) and scale.dtype == torch.float32
    assert torch.allclose(q.float().abs().amax(1), torch.full((32,), FP8_MAX))  # each row uses the full range
    deq = dequantize_fp8(q, scale)
    rel_rows = (deq - w).norm(dim=1) / w.norm(dim=1)
    assert float(rel_rows.max()) < 0.05  # e4m3: 3 mantissa bits, per-row scale keeps small rows accurate


def test_fp8_export_round_trip(tiny_hf, tmp_path):
    from safetensors.torch import load_file

    meta = export(tiny_hf, tmp_path / "e", "fp8", check_agreement=False)
    raw = load_file(tmp_path / "e" / "model.safetensors")
    qw = raw["model.layers.0.self_attn.q_proj.weight"]
    assert qw.dtype == torch.float8_e4m3fn and raw["model.layers.0.self_attn.q_proj.weight.scale"].shape == (64,)
    assert raw["model.norm.weight"].dtype == torch.float32  # norms are not quantized
    assert raw["lm_head.weight"].dtype == torch.float8_e4m3fn
    rep = meta["quantization_report"]
    assert 0 < rep["relative_weight_error"] < 0.05
    assert read_engine_meta(tmp_path / "e")["weights"] == "fp8"
    # dequantized once at load, into the runtime
    sd = load_engine_state_dict(tmp_path / "e")
    assert all(t.dtype == torch.float32 for t in sd.values()) and not any(k.endswith(".scale") for k in sd)
    cfg = json.loads((tmp_path / "e" / "config.json").read_text())
    m = ReferenceModel.from_state_dict(cfg, sd)
    full = ReferenceModel.from_pretrained(tiny_hf)
    ids = torch.randint(0, 96, (1, 12))
    pos = torch.arange(12)[None]
    a = m.forward(ids, pos, m.new_cache(1, 12))
    b = full.forward(ids, pos, full.new_cache(1, 12))
    assert float((a - b).norm() / b.norm()) < 0.1
    assert (tmp_path / "e" / "model.safetensors").stat().st_size < (tiny_hf / "model.safetensors").stat().st_size / 3


def test_bf16_and_fp32_exports(tiny_hf, tmp_path):
    from safetensors.torch import load_file

    export(tiny_hf, tmp_path / "b", "bf16", check_agreement=False)
    assert load_file(tmp_path / "b" / "model.safetensors")["lm_head.weight"].dtype == torch.bfloat16
    meta = export(tiny_hf, tmp_path / "f", "fp32", check_agreement=False)
    assert meta["quantization_report"]["relative_weight_error"] == 0.0


def test_bad_format_and_not_an_engine(tiny_hf, tmp_path):
    with pytest.raises(ValueError, match="exports fp8, bf16, fp16 or fp32"):
        export(tiny_hf, tmp_path / "x", "int4")
    with pytest.raises(FileNotFoundError, match=f"no {ENGINE_META}"):
        read_engine_meta(tiny_hf)
