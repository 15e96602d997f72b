"""The lean runtime against HF transformers on the same weights, and its position-addressed cache."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.usefixtures("one_thread")

from trt_spec.reference.model import ReferenceModel  # noqa: E402

from .conftest import KINDS, build_hf  # noqa: E402
from .oracle import plain_greedy  # noqa: E402


def full_logits(model, tokens: list[int]) -> torch.Tensor:
    cache = model.new_cache(1, len(tokens))
    return model(torch.tensor([tokens]), torch.arange(len(tokens))[None], cache)[0]


@pytest.mark.parametrize("kind", list(KINDS))
def test_logits_match_hf(checkpoints, kind):
    hf, path = checkpoints[kind]
    model = ReferenceModel.from_pretrained(path)
    tokens = torch.randint(0, 128, (1, 24), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        expected = hf(tokens).logits[0]
    got = full_logits(model, tokens[0].tolist())
    assert expected.abs().max() > 1.0  # not a degenerate model
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("kind", list(KINDS))
def test_greedy_tokens_match_hf_generate(checkpoints, kind):
    hf, path = checkpoints[kind]
    model = ReferenceModel.from_pretrained(path)
    prompts = [[5, 17, 99, 3, 42, 8, 8, 61], [120, 7]]
    for prompt in prompts:
        got = plain_greedy(model, prompt, 20)
        with torch.no_grad():
            out = hf.generate(
                torch.tensor([prompt]),
                max_new_tokens=20,
                do_sample=False,
                attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            )
        assert got == out[0, len(prompt) :].tolist()


def test_config_variants_are_read(checkpoints):
    tied = ReferenceModel.from_pretrained(checkpoints["llama_tied_rope3"][1])
    assert tied.config.tie_word_embeddings and tied.config.rope_scaling["factor"] == 8.0
    assert tied.embed.data_ptr() == tied.lm_head.w.data_ptr()  # one [V, H] table serves both
    mistral = ReferenceModel.from_pretrained(checkpoints["mistral_window"][1])
    assert mistral.config.sliding_windows == (6, 6)
    qwen = ReferenceModel.from_pretrained(checkpoints["qwen2"][1])
    assert qwen.layers[0].qkv.bias is not None and qwen.layers[0].o.bias is None


def test_old_style_rope_config_matches_new_style(checkpoints):
    """Pre-5.x configs carry rope_theta + rope_scaling {"type": ...} instead of rope_parameters."""
    hf, path = checkpoints["llama_tied_rope3"]
    cfg = json.loads((path / "config.json").read_text())
    params = dict(cfg["rope_parameters"])
    old = {k: v for k, v in cfg.items() if k != "rope_parameters"}
    old["rope_theta"] = params.pop("rope_theta")
    old["rope_scaling"] = dict(params, type=params.pop("rope_type"))
    new_style = ReferenceModel.from_state_dict(cfg, hf.state_dict())
    old_style = ReferenceModel.from_state_dict(old, hf.state_dict())
    assert torch.equal(new_style.inv_freq, old_style.inv_freq)
    plain = ReferenceModel.from_state_dict(dict(old, rope_scaling=None), hf.state_dict())
    assert not torch.allclose(plain.inv_freq, old_style.inv_freq)  # the scaling changes low frequencies


def test_from_state_dict_equals_from_pretrained(checkpoints):
    hf, path = checkpoints["llama_tied_rope3"]
    sd = {k: v for k, v in hf.state_dict().items() if k != "lm_head.weight"}  # tied: head is optional
    a = ReferenceModel.from_state_dict(hf.config.to_dict(), {k: v.to(torch.bfloat16) for k, v in sd.items()})
    b = ReferenceModel.from_pretrained(path)
    tokens = [3, 1, 4, 1, 5, 9, 2, 6]
    la, lb = full_logits(a, tokens), full_logits(b, tokens)
    assert a.lm_head.w.dtype == torch.float32
    torch.testing.assert_close(la, lb, atol=0.1, rtol=0.05)  # bf16-rounded weights: close, not equal
    assert not torch.equal(la, lb)


def test_sharded_checkpoint(checkpoints, tmp_path):
    hf, path = checkpoints["llama"]
    hf.save_pretrained(tmp_path, max_shard_size="40KB")
    assert (tmp_path / "model.safetensors.index.json").exists()
    tokens = [7, 7, 1, 2, 3]
    assert torch.equal(
        full_logits(ReferenceModel.from_pretrained(tmp_path), tokens),
        full_logits(ReferenceModel.from_pretrained(path), tokens),
    )


def test_bad_checkpoints_are_clear_errors(checkpoints, tmp_path):
    hf, path = checkpoints["llama"]
    cfg = hf.config.to_dict()
    sd = hf.state_dict()
    with pytest.raises(ValueError, match="missing .*lm_head.weight"):
        ReferenceModel.from_state_dict(cfg, {k: v for k, v in sd.items() if k != "lm_head.weight"})
    with pytest.raises(ValueError, match="unexpected .*model.layers.0.self_attn.q_proj.weight_scale"):
        ReferenceModel.from_state_dict(cfg, {**sd, "model.layers.0.self_attn.q_proj.weight_scale": torch.ones(1)})
    with pytest.raises(ValueError, match="rope type 'yarn' is not supported"):
        ReferenceModel.from_state_dict({**cfg, "rope_parameters": {"rope_type": "yarn", "factor": 4.0}}, sd)
    with pytest.raises(ValueError, match="model_type 'gpt2' is not supported"):
        ReferenceModel.from_state_dict({**cfg, "model_type": "gpt2"}, sd)
    with pytest.raises(FileNotFoundError, match="model.safetensors"):
        (tmp_path / "config.json").write_text(json.dumps(cfg))
        ReferenceModel.from_pretrained(tmp_path)


def test_chunked_prefill_and_decode_match_one_pass(target):
    tokens = [9, 8, 7, 6, 5, 4, 3, 2, 1, 0, 11, 12]
    ref = full_logits(target, tokens)
    cache = target.new_cache(1, 16)
    a = target(torch.tensor([tokens[:5]]), torch.arange(5)[None], cache)[0]
    b = target(torch.tensor([tokens[5:11]]), torch.arange(5, 11)[None], cache)[0]
    c = target(torch.tensor([tokens[11:]]), torch.tensor([[11]]), cache)[0]
    torch.testing.assert_close(torch.cat([a, b, c]), ref, atol=1e-5, rtol=1e-5)


def test_stale_positions_beyond_the_query_are_ignored(target):
    """Rejected drafts leave K/V after the current length; a later query must not see them."""
    tokens = [1, 2, 3, 4, 5, 6]
    ref = full_logits(target, tokens)
    cache = target.new_cache(1, 12)
    target(torch.tensor([tokens[:4] + [99, 98, 97]]), torch.arange(7)[None], cache)  # 3 "rejected" drafts
    got = target(torch.tensor([tokens[4:]]), torch.tensor([[4, 5]]), cache)[0]  # overwrite 4, 5; 6 stays stale
    torch.testing.assert_close(got, ref[4:], atol=1e-5, rtol=1e-5)


def test_batch_with_different_lengths_and_padding_matches_single_rows(target):
    """Left-aligned rows, per-row positions, padding entries marked with position -1."""
    prompts = [[4, 8, 15, 16, 23, 42], [1, 2, 3], [77]]
    S = max(map(len, prompts))
    tokens = torch.tensor([p + [0] * (S - len(p)) for p in prompts])
    pos = torch.tensor([list(range(len(p))) + [-1] * (S - len(p)) for p in prompts])
    cache = target.new_cache(3, 12)
    last = torch.tensor([[len(p) - 1] for p in prompts])
    batch_prefill = target(tokens, pos, cache, logits_at=last)[:, 0]  # [3, V]
    # A decode step where rows sit at different positions and feed different numbers of tokens.
    step = [[5, 6], [7, 0], [9, 10]]
    step_pos = torch.tensor([[6, 7], [3, -1], [1, 2]])
    batch_step = target(torch.tensor(step), step_pos, cache)
    for i, p in enumerate(prompts):
        n = 1 if i == 1 else 2
        alone = full_logits(target, p + step[i][:n])
        torch.testing.assert_close(batch_prefill[i], alone[len(p) - 1], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(batch_step[i, :n], alone[len(p) :], atol=1e-5, rtol=1e-5)


def test_logits_at_selects_positions(target):
    tokens = [5, 4, 3, 2, 1]
    ref = full_logits(target, tokens)
    cache = target.new_cache(1, 8)
    got = target(torch.tensor([tokens]), torch.arange(5)[None], cache, logits_at=torch.tensor([[4, 1]]))
    assert got.shape == (1, 2, 128)
    torch.testing.assert_close(got[0], ref[[4, 1]], atol=1e-5, rtol=1e-5)


def test_sliding_window_limits_attention(checkpoints):
    """Mistral window 6: logits past the window do not depend on tokens that fell out of it."""
    model = ReferenceModel.from_pretrained(checkpoints["mistral_window"][1])
    a = full_logits(model, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12])
    b = full_logits(model, [100, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12])
    # With 2 layers the receptive field of position p is p-10 .. p: position 11 no longer sees position 0.
    torch.testing.assert_close(a[11], b[11], atol=1e-5, rtol=1e-5)
    assert not torch.allclose(a[10], b[10], atol=1e-3)


def test_cache_bounds_and_batch_are_checked(target):
    cache = target.new_cache(1, 4)
    with pytest.raises(ValueError, match="beyond the cache"):
        target(torch.tensor([[1, 2, 3, 4, 5]]), torch.arange(5)[None], cache)
    with pytest.raises(ValueError, match="batch"):
        target(torch.tensor([[1], [2]]), torch.tensor([[0], [0]]), cache)


def test_build_hf_randomizes_biases():
    """The Qwen2 parity test is only meaningful if its q/k/v biases are non-zero."""
    qwen = build_hf("qwen2", 1)
    assert qwen.model.layers[0].self_attn.q_proj.bias.abs().sum() > 0
