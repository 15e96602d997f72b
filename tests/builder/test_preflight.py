"""Each preflight failure with tiny generated checkpoints: one line naming the problem and the fix."""

from pathlib import Path

import pytest
import yaml

from trt_spec.builder.hardware import named_gpu
from trt_spec.builder.preflight import PreflightError, run_preflight
from trt_spec.records.config import ConfigError, load_config
from trt_spec.records.memory import kv_cache_gib

from ..conftest import make_checkpoint


def cfg_for(tmp_path: Path, target_dir: Path, draft_dir: Path | None, **sections):
    data = {"engine": "tensorrt", "gpu": "h100:1", "target": {"checkpoint": str(target_dir)}}
    if draft_dir is not None:
        data["draft"] = {"checkpoint": str(draft_dir)}
    else:
        data.setdefault("speculative", {})["mode"] = "ngram"
    for k, v in sections.items():
        data.setdefault(k, {}).update(v) if isinstance(v, dict) else data.__setitem__(k, v)
    data.setdefault("limits", {"max_batch_size": 2, "max_input_len": 256, "max_seq_len": 512})
    p = tmp_path / "c.yaml"
    p.write_text(yaml.safe_dump(data))
    return load_config(p)


def preflight(cfg, gpu="h100:1", require=True):
    return run_preflight(cfg, named_gpu(gpu), require_checkpoints=require)


def one_line(e) -> str:
    msg = str(e.value)
    assert "\n" not in msg
    return msg


def test_compatible_pair_passes(tmp_path, tiny_pair):
    r = preflight(cfg_for(tmp_path, *tiny_pair))
    assert r.quant.weights == "fp8" and r.quant.kv_cache == "fp8"
    assert {m.role for m in r.memory} == {"target", "draft"}
    # sharing a GPU: the draft's KV cache is capped in tokens, the target's fraction leaves the draft its room
    assert r.shares_gpu and r.draft_kv_tokens == 2 * 512
    assert r.kv_cache_free_gpu_mem_fraction == 0.9  # a tiny draft: the executor's default 0.9 is the cap
    assert any("max_tokens_in_paged_kv_cache" in n for n in r.notes)
    # the draft's cap is whole 32-token KV blocks: 3 x 500 = 1500 tokens -> 47 blocks = 1504
    odd = preflight(
        cfg_for(tmp_path, *tiny_pair, limits={"max_batch_size": 3, "max_input_len": 256, "max_seq_len": 500})
    )
    assert odd.draft_kv_tokens == 1504
    # a 20 GiB reserve per engine on a 79.6 GiB H100: 59.6 GiB left after the target's reserve, of which the
    # draft needs 20 (its weights and KV cache are < 0.01 GiB): (59.6 - 20) / 59.6 = 0.664, rounded down to 0.65
    reserved = preflight(cfg_for(tmp_path, *tiny_pair, runtime={"memory_reserve_gib": 20.0}))
    assert reserved.kv_cache_free_gpu_mem_fraction == 0.65


def test_missing_checkpoint_dir(tmp_path, tiny_pair):
    with pytest.raises(PreflightError) as e:
        preflight(cfg_for(tmp_path, tmp_path / "nope", tiny_pair[1]))
    assert (
        "target.checkpoint" in one_line(e)
        and "directory not found" in str(e.value)
        and "--set target.checkpoint" in str(e.value)
    )


def test_missing_config_json(tmp_path, tiny_pair):
    (tmp_path / "empty").mkdir()
    with pytest.raises(PreflightError, match="no config.json"):
        preflight(cfg_for(tmp_path, tiny_pair[0], tmp_path / "empty"))


def test_unsupported_architecture(tmp_path, tiny_pair):
    t = make_checkpoint(tmp_path / "mamba", arch="MambaForCausalLM")
    with pytest.raises(
        PreflightError, match="architecture MambaForCausalLM is not one TensorRT-LLM 1.2's engine flow builds"
    ):
        preflight(cfg_for(tmp_path, t, tiny_pair[1]))


def test_vocab_size_gap_too_large(tmp_path):
    t = make_checkpoint(tmp_path / "t", vocab_size=512)
    d = make_checkpoint(tmp_path / "d", vocab_size=256)
    with pytest.raises(PreflightError, match="vocab sizes differ by 256 .*more than the 128 rows of padding"):
        preflight(cfg_for(tmp_path, t, d))


def test_padded_vocab_is_reported_not_refused(tmp_path):
    # Qwen2.5 32B (152064) vs 0.5B (151936): same tokenizer, 128 padded rows
    t = make_checkpoint(tmp_path / "t", vocab_size=192)
    d = make_checkpoint(tmp_path / "d", vocab_size=64)
    r = preflight(cfg_for(tmp_path, t, d))
    assert any("vocab padding" in n and "128" in n for n in r.notes)


def test_token_text_mismatch_named(tmp_path):
    toks = [f"tok{i}" for i in range(60)]
    other = list(toks)
    other[17] = "different"
    t = make_checkpoint(tmp_path / "t", tokens=toks)
    d = make_checkpoint(tmp_path / "d", tokens=other)
    with pytest.raises(PreflightError, match="tokenizers differ at token id 17: target 'tok17' vs draft 'different'"):
        preflight(cfg_for(tmp_path, t, d))


def test_low_ids_are_not_compared(tmp_path):
    toks = [f"tok{i}" for i in range(60)]
    other = list(toks)
    other[4] = "<unk-variant>"  # ids below 5 are special tokens that may legitimately differ
    target = make_checkpoint(tmp_path / "t", tokens=toks)
    preflight(cfg_for(tmp_path, target, make_checkpoint(tmp_path / "d", tokens=other)))  # accepted
    other[4], other[5] = toks[4], "<unk-variant>"  # id 5 is the first one compared
    with pytest.raises(PreflightError, match="tokenizers differ at token id 5: target 'tok5' vs draft '<unk-variant>'"):
        preflight(cfg_for(tmp_path, target, make_checkpoint(tmp_path / "d5", tokens=other)))


def test_bos_eos_mismatch(tmp_path):
    t = make_checkpoint(tmp_path / "t", eos=[2, 3])
    d = make_checkpoint(tmp_path / "d", eos=2)
    with pytest.raises(PreflightError, match=r"EOS tokens differ \(target \[2, 3\], draft \[2\]\)"):
        preflight(cfg_for(tmp_path, t, d))
    d2 = make_checkpoint(tmp_path / "d2", bos=0, eos=[2, 3])
    with pytest.raises(PreflightError, match="BOS token differs"):
        preflight(cfg_for(tmp_path, t, d2))


def test_max_draft_len_rules(tmp_path, tiny_pair):
    with pytest.raises(PreflightError, match="max_draft_len must be >= 1 for mode draft_target, got 0"):
        preflight(cfg_for(tmp_path, *tiny_pair, speculative={"max_draft_len": 0}))
    with pytest.raises(PreflightError, match="num_draft_tokens 6 > max_draft_len 4"):
        preflight(cfg_for(tmp_path, *tiny_pair, speculative={"max_draft_len": 4, "num_draft_tokens": 6}))
    with pytest.raises(PreflightError, match="max_draft_len must be >= 1 for mode ngram"):
        preflight(cfg_for(tmp_path, tiny_pair[0], None, speculative={"mode": "ngram", "max_draft_len": 0}))


def test_tp_must_divide_kv_heads(tmp_path):
    t = make_checkpoint(tmp_path / "t", heads=8, kv_heads=2)
    d = make_checkpoint(tmp_path / "d")
    with pytest.raises(
        PreflightError, match=r"target.tp 4 does not divide the 2 KV heads of target; use tp in \[1, 2\]"
    ):
        preflight(cfg_for(tmp_path, t, d, target={"tp": 4}), gpu="h100:8")


def test_fp8_on_ampere_refused_without_fallback(tmp_path, tiny_pair):
    with pytest.raises(PreflightError) as e:
        preflight(cfg_for(tmp_path, *tiny_pair), gpu="a100-80gb:1")
    msg = one_line(e)
    assert "needs compute capability >= 8.9" in msg and "SM 8.0" in msg and "fallback: int8_sq" in msg


def test_fp8_on_ampere_uses_configured_fallback_with_warning(tmp_path, tiny_pair):
    r = preflight(cfg_for(tmp_path, *tiny_pair, quantization={"fallback": "int8_sq"}), gpu="a100-80gb:1")
    # draft-target: 16-bit KV cache (an INT8 KV cache disables the block reuse a speculative target needs)
    assert r.quant.weights == "int8_sq" and r.quant.kv_cache == "none" and r.quant.fell_back
    assert any("no FP8" in w and "int8_sq" in w for w in r.warnings)
    assert any("KV cache kept 16-bit" in w for w in r.warnings)
    # a mode without external drafts keeps the INT8 KV cache
    c = cfg_for(tmp_path, tiny_pair[0], None, quantization={"fallback": "int8_sq"}, speculative={"mode": "lookahead"})
    assert preflight(c, gpu="a100-80gb:1").quant.kv_cache == "int8"


@pytest.mark.parametrize("mode", ["draft_target", "ngram"])
def test_int8_kv_cache_refused_for_external_draft_modes(tmp_path, tiny_pair, mode):
    draft = tiny_pair[1] if mode == "draft_target" else None
    c = cfg_for(
        tmp_path,
        tiny_pair[0],
        draft,
        quantization={"weights": "int8_sq", "kv_cache": "int8"},
        speculative={"mode": mode},
    )
    with pytest.raises(PreflightError) as e:
        preflight(c, gpu="a100-80gb:1")
    msg = one_line(e)
    assert "kv_cache int8" in msg and "KV cache block reuse must be enabled" in msg and "kv_cache: auto" in msg


def test_fp8_kv_without_fp8_weights_refused_for_draft_target(tmp_path, tiny_pair):
    c = cfg_for(tmp_path, *tiny_pair, quantization={"weights": "int4_awq", "kv_cache": "fp8"})
    with pytest.raises(PreflightError, match="paged context FMHA off for an FP8 KV cache without FP8 weights"):
        preflight(c, gpu="h100:1")


def test_short_max_num_tokens_refused_for_external_draft_modes(tmp_path, tiny_pair):
    c = cfg_for(tmp_path, *tiny_pair, limits={"max_input_len": 4096, "max_seq_len": 8192, "max_num_tokens": 4096})
    with pytest.raises(PreflightError) as e:
        preflight(c)
    assert "max_num_tokens 4096 < max_seq_len - 1 (8191)" in one_line(e) and "max_num_tokens: 8192" in str(e.value)


def test_draft_logits_need_equal_vocab_sizes(tmp_path):
    t = make_checkpoint(tmp_path / "t", vocab_size=192)
    d = make_checkpoint(tmp_path / "d", vocab_size=128)
    with pytest.raises(PreflightError) as e:
        preflight(cfg_for(tmp_path, t, d, speculative={"use_draft_logits": True}))
    assert "use_draft_logits with different vocab sizes (target 192, draft 128)" in one_line(e)


def test_gemma_is_tensor_parallel_only(tmp_path, tiny_pair):
    t = make_checkpoint(tmp_path / "g", arch="GemmaForCausalLM")
    with pytest.raises(PreflightError, match="Gemma's convert_checkpoint.py supports tensor parallelism only"):
        preflight(cfg_for(tmp_path, t, None, target={"pp": 2}, speculative={"mode": "ngram"}), gpu="h100:2")


def test_auto_weights_pick_fp8_on_hopper_and_fallback_on_ampere(tmp_path, tiny_pair):
    c = cfg_for(tmp_path, *tiny_pair, quantization={"weights": "auto", "fallback": "int8_wo"})
    assert preflight(c, gpu="h100:1").quant.weights == "fp8"
    r = preflight(c, gpu="a100-40gb:1")
    assert r.quant.weights == "int8_wo" and r.quant.kv_cache == "none"


def test_fp8_context_fmha_follows_what_the_builder_decides(tmp_path, tiny_pair):
    # builder.py turns it on by itself with FP8 weights + FP8 KV + paged context FMHA on SM >= 89
    assert preflight(cfg_for(tmp_path, *tiny_pair), gpu="l40s:1").quant.fp8_context_fmha
    c = cfg_for(tmp_path, *tiny_pair, quantization={"weights": "bf16", "kv_cache": "auto"})
    assert not preflight(c, gpu="h100:1").quant.fp8_context_fmha
    with pytest.raises(ConfigError, match="fp8_context_fmha was removed"):
        cfg_for(tmp_path, *tiny_pair, quantization={"fp8_context_fmha": True})


def test_memory_plan_refuses_with_numbers(tmp_path):
    # A model whose weights alone exceed an L4: hidden 8192 x 40 layers.
    t = make_checkpoint(tmp_path / "t", hidden=8192, heads=64, kv_heads=8, layers=40, vocab_size=64)
    d = make_checkpoint(tmp_path / "d")
    with pytest.raises(PreflightError) as e:
        preflight(cfg_for(tmp_path, t, d), gpu="l4:1")
    msg = one_line(e)
    assert msg.startswith("GPU 0 (l4, 22.5 GiB) needs ") and "target weights" in msg and "draft weights" in msg
    assert "draft_gpu_device_ids" in msg


def test_draft_costs_extra_memory_on_shared_gpu(tmp_path, tiny_pair):
    shared = preflight(cfg_for(tmp_path, *tiny_pair))
    assert shared.gpu_totals()[0] > sum(m.total_gib for m in shared.memory if m.role == "target")
    apart = preflight(cfg_for(tmp_path, *tiny_pair, runtime={"draft_gpu_device_ids": [1]}), gpu="h100:2")
    assert not apart.shares_gpu and apart.kv_cache_free_gpu_mem_fraction == 0.9
    assert set(apart.gpu_totals()) == {0, 1}


def test_kv_cache_formula():
    # L x kv_heads x head_dim x 2 (K and V) x bytes x batch x seq
    from trt_spec.builder.model_info import KNOWN_MODELS

    m = KNOWN_MODELS["llama-3.3-70b-instruct"]
    assert kv_cache_gib(m, "fp8", 8, 8192) == pytest.approx(80 * 8 * 128 * 2 * 1 * 8 * 8192 / 1024**3)
    assert kv_cache_gib(m, "none", 1, 1024) == pytest.approx(2 * kv_cache_gib(m, "fp8", 1, 1024))


def test_max_seq_len_beyond_model(tmp_path):
    t = make_checkpoint(tmp_path / "t", max_pos=256)
    with pytest.raises(PreflightError, match="exceeds target's max_position_embeddings 256"):
        preflight(cfg_for(tmp_path, t, make_checkpoint(tmp_path / "d")))


def test_plan_mode_tolerates_absent_checkpoints_only_for_known_models(tmp_path):
    c = cfg_for(
        tmp_path,
        Path("/nowhere/Llama-3.3-70B-Instruct"),
        Path("/nowhere/Llama-3.2-1B-Instruct"),
        target={"tp": 2},
        runtime={"gpu_device_ids": [0, 1]},
    )
    r = run_preflight(c, named_gpu("h100:2"), require_checkpoints=False)
    assert "built-in table" in r.target.source
    with pytest.raises(PreflightError, match="directory not found"):
        run_preflight(c, named_gpu("h100:2"), require_checkpoints=True)
    c2 = cfg_for(tmp_path, Path("/nowhere/MyPrivateModel"), None)
    with pytest.raises(PreflightError, match="not in the built-in model table"):
        run_preflight(c2, named_gpu("h100:1"), require_checkpoints=False)


def test_lookahead_and_medusa_draft_len(tmp_path, tiny_pair):
    t = tiny_pair[0]
    with pytest.raises(PreflightError, match=r"needs \(N-2\)\+\(W-1\+G\)\*\(N-1\) = 15"):
        preflight(cfg_for(tmp_path, t, None, speculative={"mode": "lookahead", "max_draft_len": 5}))
    r = preflight(cfg_for(tmp_path, t, None, speculative={"mode": "lookahead"}))
    assert r.max_draft_len == 15
    heads = make_checkpoint(tmp_path / "heads")
    with pytest.raises(PreflightError, match="max_draft_len 5 < 63 nodes of the medusa tree"):
        preflight(cfg_for(tmp_path, t, None, speculative={"mode": "medusa", "medusa": {"heads_dir": str(heads)}}))


def test_eagle_refuses_fp8(tmp_path, tiny_pair):
    heads = make_checkpoint(tmp_path / "eh")
    c = cfg_for(
        tmp_path,
        tiny_pair[0],
        None,
        speculative={"mode": "eagle", "max_draft_len": 63, "eagle": {"heads_dir": str(heads)}},
    )
    with pytest.raises(PreflightError, match="EAGLE engines are FP16/BF16 only"):
        preflight(c)


def test_eagle_on_the_reference_engine_trains_or_takes_an_eagle3_head(tmp_path, tiny_pair):
    heads = make_checkpoint(tmp_path / "eh")  # a plain Llama directory, not an EAGLE-3 head
    data = {
        "engine": "reference",
        "target": {"checkpoint": str(tiny_pair[0])},
        "speculative": {"mode": "eagle", "max_draft_len": 4, "eagle": {"heads_dir": str(heads)}},
        "quantization": {"weights": "fp32"},
        "limits": {"max_batch_size": 2, "max_input_len": 256, "max_seq_len": 512},
    }
    p = tmp_path / "r.yaml"
    p.write_text(yaml.safe_dump(data))
    with pytest.raises(PreflightError, match="is not an EAGLE-3 head"):
        run_preflight(load_config(p), None, require_checkpoints=True)
    data["speculative"]["eagle"] = {"train": {"steps": 5}}
    p.write_text(yaml.safe_dump(data))
    run_preflight(load_config(p), None, require_checkpoints=True)  # fp32 and a chain: no tree/dtype rule applies
    data["engine"], data["gpu"] = "tensorrt", "h100:1"
    p.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError, match="speculative.eagle.train is for engine: reference"):
        load_config(p)
    data["engine"] = "reference"
    data["speculative"]["eagle"] = {}
    p.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError, match="exactly one of speculative.eagle.heads_dir"):
        load_config(p)


def test_model_facts_keep_their_types_for_the_manifest(tmp_path):
    """A config.json whose bos_token_id is a list (as some checkpoints write it) gives one int: the facts go into the
    typed manifest, which refuses a list where an id belongs."""
    import json

    from trt_spec.builder.model_info import read_model_info

    d = make_checkpoint(tmp_path / "m", eos=[2, 3])
    cfg = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**cfg, "bos_token_id": [1, 5]}))
    info = read_model_info(d, "target")
    assert info.bos_token_id == 1 and info.eos_token_ids == (2, 3)


def test_the_memory_table_shows_the_kv_budget_the_executor_will_allocate():
    """The backend sizes the target's KV cache as kv_cache_free_gpu_mem_fraction x what its weights leave free, not as
    the plan's max_batch_size full sequences: the table shows both, per target GPU."""
    import re

    cfg = load_config(Path(__file__).resolve().parents[2] / "build_configs" / "llama33-70b-fp8-h100-tp2.yaml")
    r = run_preflight(cfg, named_gpu("h100:2"), require_checkpoints=False)
    budget = [ln for ln in r.memory_table().splitlines() if "KV budget at load" in ln]
    assert len(budget) == 2  # TP2: one line per target GPU
    t = next(m for m in r.memory if m.role == "target")
    free = r.gpu.memory_gib - t.weights_gib - t.reserve_gib
    want = f"{r.kv_cache_free_gpu_mem_fraction:.2f} x {free:.1f}Gi free after the target's weights = "
    assert want in budget[0] and f"= {r.kv_cache_free_gpu_mem_fraction * free:.1f}Gi" in budget[0]
    assert re.search(rf"need {t.kv_gib:.1f}Gi\)$", budget[0])
