"""EAGLE-3 draft head: the module, its checkpoint layout (upstream-facts: eagle3-checkpoint-layout) and drafting.

Per position t the head reads the target's features f_t at `aux_layers` [3H] and the embedding of x_{t+1}, and
predicts x_{t+2}: g = fc(f_t) (later steps feed back the head's own pre-norm output h), one decoder layer whose q/k/v
read [input_layernorm(e) ; hidden_norm(g)] (2H), then lm_head(norm(h)) over the draft vocabulary (target = draft +
d2t[draft]). Drafting keeps per-sequence head K/V (`HeadState`, slot t = (f_t, x_{t+1}) at rope position t).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Sequence

import torch
import torch.nn.functional as F
from torch import nn

ARCHITECTURE = "LlamaForCausalLMEagle3"
HEAD_DIR = "eagle3"  # inside an engine directory
REPORT_NAME = "trt_spec_eagle.json"
EAGLE3_LAYOUT_SOURCES = (
    "vllm-project/vllm vllm/model_executor/models/llama_eagle3.py (Eagle3LlamaForCausalLM.load_weights, LlamaModel.fc)",
    "NVIDIA/TensorRT-LLM tensorrt_llm/_torch/models/modeling_speculative.py (Eagle3ForCausalLM, Eagle3DecoderLayer)",
)


def default_aux_layers(num_layers: int) -> tuple[int, int, int]:
    """(2, L // 2, L - 3) clamped to 0..L - 1 (upstream-facts: eagle3-default-aux-layers)."""
    return tuple(min(max(i, 0), num_layers - 1) for i in (2, num_layers // 2, num_layers - 3))  # type: ignore[return-value]


@dataclass(frozen=True)
class HeadConfig:
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int  # target's
    draft_vocab_size: int
    rms_norm_eps: float
    rope_theta: float
    aux_layers: tuple[int, ...]

    def to_hf(self, target_cfg: dict) -> dict:
        return {
            "architectures": [ARCHITECTURE],
            "model_type": "llama",
            "num_hidden_layers": 1,
            "hidden_size": self.hidden_size,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "intermediate_size": self.intermediate_size,
            "hidden_act": "silu",
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "vocab_size": self.vocab_size,
            "draft_vocab_size": self.draft_vocab_size,
            "max_position_embeddings": target_cfg.get("max_position_embeddings", 2048),
            "bos_token_id": target_cfg.get("bos_token_id"),
            "eos_token_id": target_cfg.get("eos_token_id"),
            "tie_word_embeddings": False,
            "torch_dtype": "float32",
            "target_hidden_size": self.hidden_size,
            "eagle_config": {
                "eagle_aux_hidden_state_layer_ids": list(self.aux_layers),
                "use_aux_hidden_state": True,
                "use_input_layernorm_in_first_layer": True,
                "use_last_layernorm": True,
            },
        }

    @classmethod
    def from_hf(cls, cfg: dict, target_num_layers: Optional[int] = None) -> "HeadConfig":
        if ARCHITECTURE not in (cfg.get("architectures") or []):
            raise ValueError(
                f"not an EAGLE-3 head: architectures {cfg.get('architectures')}, expected [{ARCHITECTURE!r}]"
            )
        ec = cfg.get("eagle_config") or {}
        aux = ec.get("eagle_aux_hidden_state_layer_ids")
        if aux is None:
            if target_num_layers is None:
                raise ValueError("the head's config names no eagle_aux_hidden_state_layer_ids")
            aux = default_aux_layers(target_num_layers)
        heads = cfg["num_attention_heads"]
        return cls(
            cfg["hidden_size"],
            heads,
            cfg.get("num_key_value_heads") or heads,
            cfg.get("head_dim") or cfg["hidden_size"] // heads,
            cfg["intermediate_size"],
            cfg["vocab_size"],
            cfg.get("draft_vocab_size") or cfg["vocab_size"],
            float(cfg.get("rms_norm_eps", 1e-6)),
            float(cfg.get("rope_theta", 10000.0)),
            tuple(int(i) for i in aux),
        )


class _RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)


def _rope(x: torch.Tensor, pos: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
    """x [..., S, D] rotated at positions pos [S] (or broadcastable [..., S])."""
    f = pos[..., None].float() * inv_freq  # [..., S, D/2]
    cos, sin = torch.cat((f, f), -1).cos(), torch.cat((f, f), -1).sin()
    x1, x2 = x.chunk(2, -1)
    return x * cos + torch.cat((-x2, x1), -1) * sin


class Eagle3Head(nn.Module):
    """The head's weights under the checkpoint's names; `train_forward` runs training-time test."""

    def __init__(self, cfg: HeadConfig):
        super().__init__()
        self.cfg = cfg
        H, D = cfg.hidden_size, cfg.head_dim
        self.fc = nn.Linear(len(cfg.aux_layers) * H, H, bias=False)
        self.midlayer = nn.Module()
        m = self.midlayer
        m.input_layernorm = _RMSNorm(H, cfg.rms_norm_eps)
        m.hidden_norm = _RMSNorm(H, cfg.rms_norm_eps)
        m.self_attn = nn.Module()
        m.self_attn.q_proj = nn.Linear(2 * H, cfg.num_heads * D, bias=False)
        m.self_attn.k_proj = nn.Linear(2 * H, cfg.num_kv_heads * D, bias=False)
        m.self_attn.v_proj = nn.Linear(2 * H, cfg.num_kv_heads * D, bias=False)
        m.self_attn.o_proj = nn.Linear(cfg.num_heads * D, H, bias=False)
        m.post_attention_layernorm = _RMSNorm(H, cfg.rms_norm_eps)
        m.mlp = nn.Module()
        m.mlp.gate_proj = nn.Linear(H, cfg.intermediate_size, bias=False)
        m.mlp.up_proj = nn.Linear(H, cfg.intermediate_size, bias=False)
        m.mlp.down_proj = nn.Linear(cfg.intermediate_size, H, bias=False)
        self.norm = _RMSNorm(H, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(H, cfg.draft_vocab_size, bias=False)
        self.register_buffer("d2t", torch.zeros(cfg.draft_vocab_size, dtype=torch.int64))
        self.register_buffer("t2d", torch.zeros(cfg.vocab_size, dtype=torch.bool))
        self.register_buffer(
            "inv_freq", 1.0 / (cfg.rope_theta ** (torch.arange(0, D, 2).float() / D)), persistent=False
        )

    def qkv(self, emb: torch.Tensor, g: torch.Tensor, pos: torch.Tensor):
        """q [.., nh, S, D], k/v [.., nkv, S, D] (rotated) for embeddings and hidden inputs [.., S, H]."""
        m, c = self.midlayer, self.cfg
        x = torch.cat((m.input_layernorm(emb), m.hidden_norm(g)), -1)
        q = m.self_attn.q_proj(x).unflatten(-1, (c.num_heads, c.head_dim)).transpose(-3, -2)
        k = m.self_attn.k_proj(x).unflatten(-1, (c.num_kv_heads, c.head_dim)).transpose(-3, -2)
        v = m.self_attn.v_proj(x).unflatten(-1, (c.num_kv_heads, c.head_dim)).transpose(-3, -2)
        return _rope(q, pos, self.inv_freq), _rope(k, pos, self.inv_freq), v

    def finish(self, g: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        """Pre-norm output h [.., S, H] from hidden input g and attention output [.., nh, S, D]."""
        m = self.midlayer
        r = g + m.self_attn.o_proj(attn.transpose(-3, -2).flatten(-2))
        y = m.post_attention_layernorm(r)
        return r + m.mlp.down_proj(F.silu(m.mlp.gate_proj(y)) * m.mlp.up_proj(y))

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary logits of pre-norm outputs."""
        return self.lm_head(self.norm(h))

    def to_target(self, draft_logits: torch.Tensor) -> torch.Tensor:
        """Draft logits [.., Vd] -> target-vocabulary logits [.., V], -inf outside the draft vocabulary."""
        out = draft_logits.new_full((*draft_logits.shape[:-1], self.cfg.vocab_size), float("-inf"))
        out[..., self.target_ids] = draft_logits
        return out

    @property
    def target_ids(self) -> torch.Tensor:
        return torch.arange(self.cfg.draft_vocab_size) + self.d2t

    def draft_index(self, token: int) -> int:
        """Draft index of a target token id that is in the draft vocabulary."""
        return int(torch.searchsorted(self.target_ids, token))

    def train_forward(self, feats: torch.Tensor, emb_steps: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """Draft logits [B, T, Vd] per step from feats [B, T, 3H] and emb_steps[j] [B, T, H] (x_{t+1+j}).

        Step j at t attends to step 0's keys at <= t and steps 1..j's at t only, as drafting does."""
        c = self.cfg
        B, T, _ = feats.shape
        G = c.num_heads // c.num_kv_heads
        scale = 1.0 / math.sqrt(c.head_dim)
        causal = torch.ones(T, T, dtype=torch.bool).tril()
        g = self.fc(feats)
        keys: list[torch.Tensor] = []
        values: list[torch.Tensor] = []
        out = []
        base = torch.arange(T)
        for j, emb in enumerate(emb_steps):
            q, k, v = self.qkv(emb, g, base + j)
            keys.append(k.repeat_interleave(G, 1))
            values.append(v.repeat_interleave(G, 1))
            s0 = (q @ keys[0].transpose(-1, -2)) * scale  # [B, nh, T, T]
            s0 = s0.masked_fill(~causal, float("-inf"))
            diag = [(q * keys[i]).sum(-1, keepdim=True) * scale for i in range(1, j + 1)]  # [B, nh, T, 1] each
            p = torch.softmax(torch.cat([s0, *diag], -1), -1)
            attn = p[..., :T] @ values[0]
            for i in range(1, j + 1):
                attn = attn + p[..., T + i - 1 : T + i] * values[i]
            g = self.finish(g, attn)
            out.append(self.logits(g))
        return out

    def save(self, out_dir: Path, target_cfg: dict) -> None:
        from safetensors.torch import save_file

        out_dir.mkdir(parents=True, exist_ok=True)
        sd = {k: v.detach().contiguous() for k, v in self.state_dict().items()}
        save_file(dict(sorted(sd.items())), str(out_dir / "model.safetensors"), metadata={"format": "pt"})
        (out_dir / "config.json").write_text(json.dumps(self.cfg.to_hf(target_cfg), indent=2, sort_keys=True) + "\n")

    @classmethod
    def load(cls, head_dir: str | Path, target_num_layers: Optional[int] = None) -> "Eagle3Head":
        from safetensors.torch import load_file

        d = Path(head_dir)
        cfg = HeadConfig.from_hf(json.loads((d / "config.json").read_text()), target_num_layers)
        head = cls(cfg)
        sd = load_file(str(d / "model.safetensors"))
        sd = {k.replace("layers.0.", "midlayer."): v for k, v in sd.items() if not k.startswith("embed_tokens")}
        head.load_state_dict({k: v.float() if v.is_floating_point() else v for k, v in sd.items()})
        head.eval()
        return head


@dataclass
class HeadState:
    """One sequence's head K/V; valid for slots 0..len(tokens) - 2 (slot t needs x_{t+1})."""

    k: torch.Tensor  # [nkv, capacity, D]
    v: torch.Tensor
    tokens: list[int] = field(default_factory=list)

    @classmethod
    def new(cls, head: Eagle3Head, capacity: int) -> "HeadState":
        c = head.cfg
        return cls(torch.zeros(c.num_kv_heads, capacity, c.head_dim), torch.zeros(c.num_kv_heads, capacity, c.head_dim))

    @property
    def capacity(self) -> int:
        return self.k.shape[1]

    def valid_slots(self, tokens: Sequence[int]) -> int:
        """Slots valid for a sequence starting with `tokens`."""
        n = 0
        for a, b in zip(self.tokens, tokens):
            if a != b:
                break
            n += 1
        return max(n - 1, 0)

    def copy(self, slots: int, capacity: int) -> "HeadState":
        k = torch.zeros(self.k.shape[0], capacity, self.k.shape[2])
        v = torch.zeros_like(k)
        n = min(slots, capacity, self.capacity)
        k[:, :n], v[:, :n] = self.k[:, :n], self.v[:, :n]
        return HeadState(k, v, list(self.tokens[: n + 1]))


@torch.inference_mode()
def head_step(head: Eagle3Head, state: HeadState, start: int, g: torch.Tensor, emb: torch.Tensor) -> torch.Tensor:
    """Write slots start..start+S-1 from g [S, H] (after fc) and next-token embeddings; returns h [S, H]."""
    c = head.cfg
    S = g.shape[0]
    if start + S > state.capacity:
        grown = state.copy(start, max(2 * state.capacity, start + S + 64))
        state.k, state.v = grown.k, grown.v
    pos = torch.arange(start, start + S)
    q, k, v = head.qkv(emb, g, pos)  # q [nh, S, D], k/v [nkv, S, D]
    state.k[:, start : start + S], state.v[:, start : start + S] = k, v
    G = c.num_heads // c.num_kv_heads
    kv = start + S
    K = state.k[:, :kv].repeat_interleave(G, 0)
    V = state.v[:, :kv].repeat_interleave(G, 0)
    mask = torch.arange(kv)[None, :] <= pos[:, None]  # [S, kv]
    attn = F.scaled_dot_product_attention(q[None], K[None], V[None], attn_mask=mask)[0]
    return head.finish(g, attn)
