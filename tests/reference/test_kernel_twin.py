"""The kernel twin trt-spec writes for `make gpu-smoke`: its tokenizer covers all 128256 ids and round-trips text, its
checkpoints load in transformers under Llama's names, and its config.json gives the plan the built-in table's shape."""

from __future__ import annotations

import json
from dataclasses import replace

from trt_spec.builder.model_info import KNOWN_MODELS, read_model_info
from trt_spec.reference import kernel_twin as kt


def test_tokenizer_has_every_id_detokenizes_all_and_round_trips_text(tmp_path):
    from transformers import AutoTokenizer

    kt.make_tokenizer(tmp_path)
    tok = AutoTokenizer.from_pretrained(tmp_path)
    assert len(tok) == kt.VOCAB == 128256
    text = "def add(a, b):\n    return a + b  # héllo, 日本語 ✓"
    ids = tok.encode(text, add_special_tokens=False)
    assert max(ids) < 256 and tok.decode(ids) == text
    # a random model emits any id: each one is text (fillers and Llama 3's specials by their names)
    assert tok.decode([300, 127999, 128009], skip_special_tokens=False) == "<|filler_300|><|filler_127999|><|eot_id|>"
    assert (tok.bos_token_id, tok.eos_token_id) == (128000, 128009)


def test_full_size_config_is_the_70bs_attention_shape_and_the_built_in_row(tmp_path):
    for name, info in ((kt.TARGET_DIR, kt.TARGET), (kt.DRAFT_DIR, kt.DRAFT)):
        d = tmp_path / name
        d.mkdir()
        (d / "config.json").write_text(json.dumps(kt.hf_config(info)))
        assert read_model_info(d, "target") == KNOWN_MODELS[name] == info
    llama70b = KNOWN_MODELS["llama-3.3-70b-instruct"]
    t = kt.TARGET
    assert (t.head_dim, t.vocab_size, t.num_heads // t.num_kv_heads) == (128, 128256, 8)
    assert (t.head_dim, t.vocab_size, t.num_heads // t.num_kv_heads) == (
        llama70b.head_dim,
        llama70b.vocab_size,
        llama70b.num_heads // llama70b.num_kv_heads,
    )
    assert t.hidden_size == t.num_heads * t.head_dim and (t.num_heads // 2) // (t.num_kv_heads // 2) == 8  # TP2


def test_written_twin_loads_in_transformers_and_generates_greedily(tmp_path):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    small_t = replace(kt.TARGET, hidden_size=256, num_heads=2, num_kv_heads=1, intermediate_size=128)
    small_d = replace(kt.DRAFT, hidden_size=128, num_heads=1, num_kv_heads=1, intermediate_size=64)
    spec = kt.write_twin(tmp_path, small_t, small_d)
    assert kt.write_twin(tmp_path, small_t, small_d) == spec  # the second call finds the marker and writes nothing
    for name in (kt.TARGET_DIR, kt.DRAFT_DIR):
        model, info = AutoModelForCausalLM.from_pretrained(tmp_path / name, output_loading_info=True)
        assert not info["missing_keys"] and not info["unexpected_keys"]  # Llama's weight names, every one
        assert model.config.vocab_size == 128256 and model.config.head_dim == 128
    tok = AutoTokenizer.from_pretrained(tmp_path / kt.TARGET_DIR)
    ids = tok("The capital of France is", return_tensors="pt").input_ids
    target = AutoModelForCausalLM.from_pretrained(tmp_path / kt.TARGET_DIR, dtype=torch.float32)
    out = target.generate(ids, max_new_tokens=8, do_sample=False)
    assert out.shape[1] == ids.shape[1] + 8 and isinstance(tok.decode(out[0, ids.shape[1] :]), str)
    logits = target(ids).logits[0, -1].float()
    top2 = logits.topk(2).values
    assert float(top2[0] - top2[1]) > 0.01  # greedy margins a real LM's size, not near-ties everywhere
