"""Lean fp32 CPU decoder runtime for Llama-family checkpoints (Llama, Qwen2, Mistral) with HF tensor names.

The KV cache is static and position-addressed: a query at position p sees cache positions <= p of its row, so stale
entries past a row's length (rejected drafts) are invisible; padding (input_pos < 0) writes to a never-read slot.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import torch
import torch.nn.functional as F

SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "mistral")
SUPPORTED_ROPE_TYPES = ("default", "llama3")


@dataclass(frozen=True)
class ModelConfig:
    """The subset of an HF ``config.json`` the runtime needs."""

    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict[str, Any] | None  # llama3 only
    tie_word_embeddings: bool
    sliding_windows: tuple[int | None, ...]  # per layer; None = full attention

    @classmethod
    def from_hf(cls, cfg: Mapping[str, Any]) -> ModelConfig:
        model_type = cfg.get("model_type")
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise ValueError(
                f"model_type {model_type!r} is not supported by the reference runtime; "
                f"supported: {', '.join(SUPPORTED_MODEL_TYPES)}"
            )
        act = cfg.get("hidden_act", "silu")
        if act != "silu":
            raise ValueError(f"hidden_act {act!r} is not supported; the reference runtime implements SwiGLU (silu)")
        heads = cfg["num_attention_heads"]
        layers = cfg["num_hidden_layers"]
        theta, scaling = _rope_params(cfg)
        return cls(
            model_type=model_type,
            vocab_size=cfg["vocab_size"],
            hidden_size=cfg["hidden_size"],
            intermediate_size=cfg["intermediate_size"],
            num_layers=layers,
            num_heads=heads,
            num_kv_heads=cfg.get("num_key_value_heads") or heads,
            head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
            rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
            rope_theta=theta,
            rope_scaling=scaling,
            tie_word_embeddings=cfg.get("tie_word_embeddings", False),
            sliding_windows=_sliding_windows(cfg, model_type, layers),
        )


def _rope_params(cfg: Mapping[str, Any]) -> tuple[float, dict[str, Any] | None]:
    # transformers >= 5 writes "rope_parameters", older ones "rope_theta" + "rope_scaling"
    params = dict(cfg.get("rope_parameters") or cfg.get("rope_scaling") or {})
    theta = float(params.get("rope_theta", cfg.get("rope_theta", 10000.0)))
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise ValueError(
            f"rope type {rope_type!r} is not supported by the reference runtime; "
            f"supported: {', '.join(SUPPORTED_ROPE_TYPES)}"
        )
    if params.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 1.0)) != 1.0:
        raise ValueError("partial_rotary_factor != 1.0 is not supported by the reference runtime")
    if rope_type == "default":
        return theta, None
    scaling = {
        "factor": float(params["factor"]),
        "low_freq_factor": float(params["low_freq_factor"]),
        "high_freq_factor": float(params["high_freq_factor"]),
        "original_max_position_embeddings": int(
            params.get("original_max_position_embeddings", cfg.get("max_position_embeddings"))
        ),
    }
    return theta, scaling


def _sliding_windows(cfg: Mapping[str, Any], model_type: str, layers: int) -> tuple[int | None, ...]:
    window = cfg.get("sliding_window")
    if model_type == "mistral":
        return (window,) * layers
    if model_type == "qwen2" and window is not None:
        types = cfg.get("layer_types")
        if types is None:  # pre-5.x Qwen2 configs
            use = cfg.get("use_sliding_window", False)
            first = cfg.get("max_window_layers", layers)
            types = ["sliding_attention" if use and i >= first else "full_attention" for i in range(layers)]
        return tuple(window if t == "sliding_attention" else None for t in types)
    return (None,) * layers


def rope_inv_freq(config: ModelConfig) -> torch.Tensor:
    """Inverse frequencies [head_dim // 2], with Llama 3.1 frequency scaling when configured."""
    dim = config.head_dim
    inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    s = config.rope_scaling
    if s is None:
        return inv_freq
    # long wavelengths divided by `factor`, short ones kept, interpolated in between
    old_len = s["original_max_position_embeddings"]
    low_wavelen = old_len / s["low_freq_factor"]
    high_wavelen = old_len / s["high_freq_factor"]
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / s["factor"], inv_freq)
    smooth = (old_len / wavelen - s["low_freq_factor"]) / (s["high_freq_factor"] - s["low_freq_factor"])
    smoothed = (1 - smooth) * scaled / s["factor"] + smooth * scaled
    medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, scaled)


class KVCache:
    """Static per-layer K/V buffers [B, kv_heads, max_len + 1, head_dim]; the extra slot takes padding writes."""

    def __init__(self, num_layers: int, batch: int, kv_heads: int, max_len: int, head_dim: int):
        if batch < 1 or max_len < 1:
            raise ValueError(f"KVCache needs batch >= 1 and max_len >= 1, got batch={batch}, max_len={max_len}")
        self.batch = batch
        self.max_len = max_len
        shape = (batch, kv_heads, max_len + 1, head_dim)
        self.k = [torch.zeros(shape) for _ in range(num_layers)]
        self.v = [torch.zeros(shape) for _ in range(num_layers)]


def _onednn_pack(weight: torch.Tensor) -> torch.Tensor | None:
    """oneDNN-blocked copy of weight [N, K], or None where this torch build has no oneDNN linear."""
    try:
        packed = torch.ops.mkldnn._reorder_linear_weight(weight, None)
        torch.ops.mkldnn._linear_pointwise(torch.zeros(1, 2, weight.shape[1]), packed, None, "none", [], "")
    except (AttributeError, RuntimeError):
        return None
    return packed


class _Linear:
    """y = x @ W.T + b for W [N, K]: one row runs MKL gemv (W stored [K, N] when N > K), more rows oneDNN.

    Both copies are kept, doubling the fp32 weight memory."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None):
        N, K = weight.shape
        self.w = weight.t().contiguous().t() if N > K else weight.contiguous()  # [N, K] view either way
        self.packed = _onednn_pack(weight)
        self.bias = bias

    def __call__(self, x: torch.Tensor) -> torch.Tensor:  # x [B, S, K] -> [B, S, N]
        if self.packed is None or x.shape[0] * x.shape[1] == 1:
            return F.linear(x, self.w, self.bias)
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")


def _rows(linear: _Linear, x: torch.Tensor) -> torch.Tensor:
    """linear(x) for x [1, M, K]; M == 2 runs as 3 rows because oneDNN's 2-row kernel is slower (same result)."""
    if x.shape[1] != 2 or linear.packed is None:
        return linear(x)
    return linear(torch.cat((x, x[:, :1]), 1))[:, :2]


@dataclass
class _Layer:
    attn_norm: torch.Tensor  # [H]
    qkv: _Linear  # H -> (heads + 2 * kv_heads) * head_dim
    o: _Linear  # heads * head_dim -> H
    mlp_norm: torch.Tensor  # [H]
    gate_up: _Linear  # H -> 2 * I
    down: _Linear  # I -> H
    window: int | None


def load_hf_state_dict(checkpoint: Path) -> dict[str, torch.Tensor]:
    """HF-named tensors of model.safetensors or of the shards in model.safetensors.index.json."""
    from safetensors.torch import load_file

    single = checkpoint / "model.safetensors"
    if single.is_file():
        return load_file(single)
    index = checkpoint / "model.safetensors.index.json"
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        out: dict[str, torch.Tensor] = {}
        for s in shards:
            out.update(load_file(checkpoint / s))
        return out
    raise FileNotFoundError(f"{checkpoint}: no model.safetensors or model.safetensors.index.json")


class ReferenceModel:
    """Decoder-only transformer over plain fp32 tensors."""

    def __init__(self, config: ModelConfig, state_dict: Mapping[str, torch.Tensor]):
        self.config = config
        sd = {name: t.to(torch.float32) for name, t in state_dict.items()}
        expected = _expected_keys(config, sd)
        missing = sorted(k for k, required in expected.items() if required and k not in sd)
        if missing:
            raise ValueError(f"state dict is missing {len(missing)} tensors, e.g. {missing[:5]}")
        unexpected = sorted(k for k in sd if k not in expected and not k.endswith("rotary_emb.inv_freq"))
        if unexpected:
            raise ValueError(f"state dict has {len(unexpected)} unexpected tensors, e.g. {unexpected[:5]}")

        def cat(*names: str) -> torch.Tensor | None:
            return torch.cat([sd[n] for n in names]) if names[0] in sd else None

        self.layers: list[_Layer] = []
        for i in range(config.num_layers):
            p = f"model.layers.{i}."
            a, m = p + "self_attn.", p + "mlp."
            self.layers.append(
                _Layer(
                    attn_norm=sd[p + "input_layernorm.weight"],
                    qkv=_Linear(
                        cat(a + "q_proj.weight", a + "k_proj.weight", a + "v_proj.weight"),
                        cat(a + "q_proj.bias", a + "k_proj.bias", a + "v_proj.bias"),
                    ),
                    o=_Linear(sd[a + "o_proj.weight"], sd.get(a + "o_proj.bias")),
                    mlp_norm=sd[p + "post_attention_layernorm.weight"],
                    gate_up=_Linear(
                        cat(m + "gate_proj.weight", m + "up_proj.weight"), cat(m + "gate_proj.bias", m + "up_proj.bias")
                    ),
                    down=_Linear(sd[m + "down_proj.weight"], sd.get(m + "down_proj.bias")),
                    window=config.sliding_windows[i],
                )
            )
        self.norm = sd["model.norm.weight"]
        embed = sd["model.embed_tokens.weight"]  # [V, H]
        self.lm_head = _Linear(embed if config.tie_word_embeddings else sd["lm_head.weight"], None)
        # tied: reuse the head's copy instead of keeping a third
        self.embed = self.lm_head.w if config.tie_word_embeddings else embed  # [V, H]
        self.inv_freq = rope_inv_freq(config)  # [head_dim // 2]

    @classmethod
    def from_state_dict(cls, config_dict: Mapping[str, Any], state_dict: Mapping[str, torch.Tensor]) -> ReferenceModel:
        """Build from an HF config dict and HF-named tensors of any float dtype."""
        return cls(ModelConfig.from_hf(config_dict), state_dict)

    @classmethod
    def from_pretrained(cls, path: str | Path) -> ReferenceModel:
        """Load an HF checkpoint directory."""
        path = Path(path)
        config_dict = json.loads((path / "config.json").read_text())
        return cls.from_state_dict(config_dict, load_hf_state_dict(path))

    def new_cache(self, batch: int, max_len: int) -> KVCache:
        c = self.config
        return KVCache(c.num_layers, batch, c.num_kv_heads, max_len, c.head_dim)

    @torch.inference_mode()
    def forward(
        self,
        tokens: torch.Tensor,
        input_pos: torch.Tensor,
        cache: KVCache,
        logits_at: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Logits [B, N, V] for tokens [B, S] at cache positions input_pos [B, S] (-1 = padding).

        logits_at: [B, N] indices into S (default: all S)."""
        c = self.config
        B, S = tokens.shape
        if B != cache.batch:
            raise ValueError(f"tokens batch {B} != cache batch {cache.batch}")
        kv_len = int(input_pos.max()) + 1
        if kv_len < 1:
            raise ValueError("input_pos has no real (>= 0) position")
        if kv_len > cache.max_len:
            raise ValueError(f"position {kv_len - 1} is beyond the cache (max_len={cache.max_len})")
        write_pos = torch.where(input_pos < 0, cache.max_len, input_pos)  # padding -> scratch slot
        rows = torch.arange(B)[:, None]  # [B, 1]

        pos = input_pos.clamp(min=0)
        cos, sin = self._rope_tables(pos)  # [B, S, 1, D]
        masks = self._attention_masks(pos[:, None, :, None], kv_len, one_query=B == S == 1)
        G = c.num_heads // c.num_kv_heads

        x = F.embedding(tokens, self.embed)  # [B, S, H]
        nq, nk, D = c.num_heads, c.num_kv_heads, c.head_dim
        for layer, k_cache, v_cache in zip(self.layers, cache.k, cache.v):
            h = F.rms_norm(x, (c.hidden_size,), layer.attn_norm, c.rms_norm_eps)
            qkv = layer.qkv(h)  # [B, S, (nq + 2 nk) * D]
            qk = qkv[..., : (nq + nk) * D].view(B, S, nq + nk, D)
            qk = qk * cos + qk.view(B, S, nq + nk, 2, D // 2).flip(-2).view(B, S, nq + nk, D) * sin
            k_cache[rows, :, write_pos] = qk[:, :, nq:]  # [B, S, nk, D] into [B, nk, L, D]
            v_cache[rows, :, write_pos] = qkv[..., (nq + nk) * D :].view(B, S, nk, D)
            q = qk[:, :, :nq].view(B, S, nk, G, D).permute(0, 2, 3, 1, 4).reshape(B, nk, G * S, D)
            o = F.scaled_dot_product_attention(
                q, k_cache[:, :, :kv_len], v_cache[:, :, :kv_len], attn_mask=masks[layer.window]
            )  # [B, nk, G * S, D]
            o = o.view(B, nk, G, S, D).permute(0, 3, 1, 2, 4).reshape(B, S, nq * D)
            x = x + layer.o(o)
            h = F.rms_norm(x, (c.hidden_size,), layer.mlp_norm, c.rms_norm_eps)
            gate, up = layer.gate_up(h).chunk(2, -1)
            x = x + layer.down(F.silu(gate) * up)

        if logits_at is not None:
            x = x[rows, logits_at]  # [B, N, H]
        x = F.rms_norm(x, (c.hidden_size,), self.norm, c.rms_norm_eps)
        return self.lm_head(x)

    __call__ = forward

    def _rope_tables(self, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """RoPE (cos, sin) [B, S, 1, D] for pos [B, S]; sin is pre-negated so flip_halves(x) * sin == rotate_half."""
        freqs = pos[..., None].float() * self.inv_freq  # [B, S, D/2]
        cos = torch.cat((freqs, freqs), -1).cos()[:, :, None, :]
        sin = freqs.sin()
        sin = torch.cat((-sin, sin), -1)[:, :, None, :]
        return cos, sin

    def _attention_masks(
        self, q_pos: torch.Tensor, kv_len: int, *, one_query: bool
    ) -> dict[int | None, torch.Tensor | None]:
        """Window -> mask [B, 1, G * S, kv_len] for q_pos [B, 1, S, 1]; G query heads are folded per KV head.

        one_query: a single last-position query needs no mask when the window covers every key."""
        G = self.config.num_heads // self.config.num_kv_heads
        k_pos = torch.arange(kv_len)
        masks: dict[int | None, torch.Tensor | None] = {}
        for window in set(self.config.sliding_windows):
            if one_query and (window is None or window >= kv_len):
                masks[window] = None
                continue
            m = k_pos <= q_pos  # [B, 1, S, kv_len]
            if window is not None:
                m = m & (k_pos > q_pos - window)
            masks[window] = m.repeat(1, 1, G, 1)
        return masks

    def _packed_segments(self, input_pos: torch.Tensor, segments: Sequence[tuple[KVCache, int]]) -> list[tuple]:
        """Checked segments: (cache, start, n, positions [1, n], kv_len, masks by window)."""
        segs = []
        start = 0
        for cache, n in segments:
            if cache.batch != 1:
                raise ValueError(f"forward_packed needs batch-1 caches, got batch {cache.batch}")
            pos = input_pos[start : start + n][None]  # [1, n]
            kv_len = int(pos.max()) + 1
            if int(pos.min()) < 0 or kv_len > cache.max_len:
                raise ValueError(
                    f"positions {int(pos.min())}..{kv_len - 1} outside the cache (max_len={cache.max_len})"
                )
            masks = self._attention_masks(pos[:, None, :, None], kv_len, one_query=n == 1)
            segs.append((cache, start, n, pos, kv_len, masks))
            start += n
        return segs

    @torch.inference_mode()
    def forward_packed(
        self,
        tokens: torch.Tensor,
        input_pos: torch.Tensor,
        segments: Sequence[tuple[KVCache, int]],
        logits_at: torch.Tensor,
        aux_layers: Sequence[int] = (),
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """One pass over a ragged batch: tokens, input_pos [T] concatenated per segment (cache, n); logits_at [N].

        Returns logits [N, V], plus with aux_layers those layers' inputs [T, len(aux_layers) * H] (EAGLE-3 features).
        Matches a solo `forward` bit for bit except for one-row (gemv) decode rows.
        """
        c = self.config
        T = tokens.shape[0]
        if input_pos.shape != (T,) or sum(n for _, n in segments) != T:
            raise ValueError(f"tokens [{T}], input_pos {list(input_pos.shape)} and segment lengths disagree")
        cos, sin = self._rope_tables(input_pos[None])  # [1, T, 1, D]
        G = c.num_heads // c.num_kv_heads
        segs = self._packed_segments(input_pos, segments)

        x = F.embedding(tokens[None], self.embed)  # [1, T, H]
        nq, nk, D = c.num_heads, c.num_kv_heads, c.head_dim
        row0 = torch.zeros(1, 1, dtype=torch.long)
        aux = {li: None for li in aux_layers}
        for li, layer in enumerate(self.layers):
            if li in aux:
                aux[li] = x[0]
            h = F.rms_norm(x, (c.hidden_size,), layer.attn_norm, c.rms_norm_eps)
            qkv = _rows(layer.qkv, h)  # [1, T, (nq + 2 nk) * D]
            qk = qkv[..., : (nq + nk) * D].view(1, T, nq + nk, D)
            qk = qk * cos + qk.view(1, T, nq + nk, 2, D // 2).flip(-2).view(1, T, nq + nk, D) * sin
            v_new = qkv[..., (nq + nk) * D :].view(1, T, nk, D)
            outs = []
            for cache, s, n, pos, kv_len, masks in segs:
                k_cache, v_cache = cache.k[li], cache.v[li]
                k_cache[row0, :, pos] = qk[:, s : s + n, nq:]  # [1, n, nk, D] into [1, nk, L, D]
                v_cache[row0, :, pos] = v_new[:, s : s + n]
                q = qk[:, s : s + n, :nq].reshape(1, n, nk, G, D).permute(0, 2, 3, 1, 4).reshape(1, nk, G * n, D)
                o = F.scaled_dot_product_attention(
                    q, k_cache[:, :, :kv_len], v_cache[:, :, :kv_len], attn_mask=masks[layer.window]
                )  # [1, nk, G * n, D]
                outs.append(o.view(1, nk, G, n, D).permute(0, 3, 1, 2, 4).reshape(1, n, nq * D))
            x = x + _rows(layer.o, torch.cat(outs, 1) if len(outs) > 1 else outs[0])
            h = F.rms_norm(x, (c.hidden_size,), layer.mlp_norm, c.rms_norm_eps)
            gate, up = _rows(layer.gate_up, h).chunk(2, -1)
            x = x + _rows(layer.down, F.silu(gate) * up)

        x = F.rms_norm(x[:, logits_at], (c.hidden_size,), self.norm, c.rms_norm_eps)  # [1, N, H]
        logits = _rows(self.lm_head, x)[0]
        if aux_layers:
            return logits, torch.cat([aux[li] for li in aux_layers], -1)
        return logits


def _expected_keys(config: ModelConfig, sd: Mapping[str, torch.Tensor]) -> dict[str, bool]:
    """Every tensor name the runtime reads -> whether it is required."""
    keys = {"model.embed_tokens.weight": True, "model.norm.weight": True}
    keys["lm_head.weight"] = not config.tie_word_embeddings
    for i in range(config.num_layers):
        p = f"model.layers.{i}."
        keys[p + "input_layernorm.weight"] = True
        keys[p + "post_attention_layernorm.weight"] = True
        for proj in (
            "self_attn.q_proj",
            "self_attn.k_proj",
            "self_attn.v_proj",
            "self_attn.o_proj",
            "mlp.gate_proj",
            "mlp.up_proj",
            "mlp.down_proj",
        ):
            keys[p + proj + ".weight"] = True
            keys[p + proj + ".bias"] = False
        # fused biases need all their parts
        for group in (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj")):
            mod = "self_attn." if group[0] == "q_proj" else "mlp."
            names = [p + mod + g + ".bias" for g in group]
            if any(n in sd for n in names):
                for n in names:
                    keys[n] = True
    return keys
