"""Distill a tiny Llama draft from the target, offline and deterministically (a build step).

The draft is a Hugging Face LlamaForCausalLM directory with the target's tokenizer files, vocab and special ids; its
tied vocab x hidden LM head sets its cost. Its embedding starts as the target's embedding projected onto the top
principal directions of the target's final hidden states (the embedding's own SVD directions barely keep the
teacher's argmax). The teacher runs once (top-k log-probs + hidden states on stdlib chunks and on its greedy chat
answers); training alternates teacher steps (soft CE + hidden-state MSE) and raw next-token steps, with the softmax
over the most frequent tokens plus sampled negatives.

CLI: python -m trt_spec.reference.distill --teacher DIR --output_dir DIR [--hidden 128 ...]; bad input exits 2.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import shutil
import statistics
import sys
import sysconfig
import time
import zlib
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Literal, get_args

from ..errors import TrtSpecError
from ..records.names import TOKENIZER_FILES

REPORT_NAME = "trt_spec_distill.json"
CHAT_FORMAT = "<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n"
# Disjoint from EVAL_CHAT_PROMPTS and from the benchmark prompt sets in trt_spec.harness.prompts.
TRAIN_CHAT_PROMPTS = (
    "Write a Python function that reverses a linked list.",
    "Explain what a Python decorator is, with a short example.",
    "Write a Python function that merges two sorted lists into one sorted list.",
    "What is the difference between a list and a tuple in Python?",
    "Write a Python script that reads a CSV file and prints the sum of the second column.",
    "Give three tips for writing readable code.",
    "Write a Python class `Counter` with increment, decrement and reset methods.",
    "What does the `with` statement do in Python?",
    "Write a Python function that removes duplicates from a list while keeping the order.",
    "Explain recursion to a beginner in a few sentences.",
    "Write a Python function that converts a temperature from Celsius to Fahrenheit.",
    "What is a hash table and why is lookup fast?",
    "Write a Python generator that yields prime numbers.",
    "Summarize the benefits of unit testing in a short paragraph.",
    "Write a Python function that flattens a nested list.",
    "How do I sort a dictionary by value in Python?",
)
EVAL_CHAT_PROMPTS = (
    "Write a Python function that returns the largest element of a list without using max().",
    "Why is the sky blue? Answer briefly.",
    "Write a Python function that counts the vowels in a string.",
)


class DistillError(TrtSpecError, ValueError):
    """Bad input to the distillation step (reported as one line by the CLI)."""


InitMethod = Literal["hidden_pca", "embedding_pca", "random"]


@dataclass(frozen=True)
class DistillConfig:
    """Every knob of one distillation run; the CLI reads its defaults from here."""

    teacher_dir: Path
    out_dir: Path
    hidden: int = 128
    layers: int = 2
    heads: int | None = None  # None: hidden / head_dim
    kv_heads: int = 1  # capped at heads
    head_dim: int = 64
    intermediate: int | None = None  # None: 4 * hidden
    init: InitMethod = "hidden_pca"
    steps: int = 600
    seq_len: int = 256
    seed: int = 0
    lr: float = 5e-3
    batch: int = 4
    threads: int = 2
    teacher_chunks: int = 96
    raw_chunks: int = 2048
    eval_chunks: int = 8
    topk: int = 32
    chat_prompts: int = 16
    # dtype of the saved weights; training runs in float32
    dtype: str = "float32"
    chat_tokens: int = 96
    eval_chat_prompts: int = 3
    corpus_files: tuple[Path, ...] | None = None  # None: the standard library (stdlib_files())
    teacher_fraction: float = 0.5
    kl_weight: float = 1.0
    mse_weight: float = 1.0
    raw_weight: float = 1.0
    neg_samples: int = 1024
    train_vocab: int = 8192
    measure_cost: bool = True
    eval_every: int = 0  # held-out code agreement every N steps (0: only at the end)

    def __post_init__(self) -> None:
        object.__setattr__(self, "teacher_dir", Path(self.teacher_dir))
        object.__setattr__(self, "out_dir", Path(self.out_dir))
        if self.corpus_files is not None:
            object.__setattr__(self, "corpus_files", tuple(Path(p) for p in self.corpus_files))

    def validate(self) -> None:
        if self.hidden < 8 or self.layers < 1 or self.steps < 1 or self.seq_len < 4 or self.batch < 1:
            raise DistillError(
                f"bad sizes: hidden={self.hidden} layers={self.layers} steps={self.steps} "
                f"seq_len={self.seq_len} batch={self.batch}"
            )
        if self.dtype not in SAVE_DTYPES:
            raise DistillError(f"dtype {self.dtype!r}: expected one of {', '.join(SAVE_DTYPES)}")
        if self.init not in get_args(InitMethod):
            raise DistillError(f"init {self.init!r}: expected hidden_pca, embedding_pca or random")


# DistillConfig fields exposed as `--name` options
CLI_OPTIONS = (
    "hidden",
    "layers",
    "steps",
    "seq_len",
    "seed",
    "lr",
    "batch",
    "teacher_chunks",
    "chat_prompts",
    "train_vocab",
    "threads",
    "dtype",
)
SAVE_DTYPES = ("float32", "bfloat16", "float16")


def stdlib_files() -> list[Path]:
    """Standard-library .py files in sorted order, without tests, site-packages, encodings/ and huge files."""
    root = Path(sysconfig.get_paths()["stdlib"])
    skip_dirs = {"site-packages", "dist-packages", "test", "tests", "idle_test", "encodings", "__pycache__"}
    out = []
    for p in sorted(root.rglob("*.py"), key=lambda q: q.relative_to(root).as_posix()):
        rel = p.relative_to(root)
        if skip_dirs.intersection(rel.parts[:-1]) or not p.is_file() or p.stat().st_size > 300_000:
            continue
        out.append(p)
    return out


def _is_heldout(path: Path) -> bool:
    return zlib.crc32(path.name.encode() + str(path.parent.name).encode()) % 16 == 0


def load_corpus(
    tokenizer, files: list[Path], *, seq_len: int, train_chunks: int, eval_chunks: int, seed: int
) -> tuple[list[list[int]], list[list[int]]]:
    """(train, held-out) token chunks of seq_len; held-out files are picked by a hash of the name."""
    files = list(files)
    heldout = [p for p in files if _is_heldout(p)]
    train = [p for p in files if not _is_heldout(p)]
    if len(files) >= 2 and (not heldout or not train):  # tiny corpora (tests): split by position instead
        heldout, train = files[-1:], files[:-1]
    rng = random.Random(seed)
    rng.shuffle(train)
    rng.shuffle(heldout)

    def encode(paths: list[Path]) -> list[list[int]]:
        texts = [p.read_text(encoding="utf-8", errors="replace") for p in paths]
        return [e.ids for e in tokenizer.encode_batch(texts, add_special_tokens=False)]

    ev: list[list[int]] = []
    for i in range(0, len(heldout), 16):
        for ids in encode(heldout[i : i + 16]):
            if len(ids) >= seq_len:
                s = (len(ids) - seq_len) // 2
                ev.append(ids[s : s + seq_len])
            if len(ev) >= eval_chunks:
                break
        if len(ev) >= eval_chunks:
            break
    stream: list[int] = []
    need = (train_chunks + 1) * seq_len * 2  # twice what is needed so the chunk shuffle mixes files
    for i in range(0, len(train), 32):
        for ids in encode(train[i : i + 32]):
            stream.extend(ids)
        if len(stream) >= need:
            break
    chunks = [stream[i : i + seq_len + 1] for i in range(0, len(stream) - seq_len, seq_len)]
    rng.shuffle(chunks)
    return chunks[:train_chunks], ev


def teacher_label(teacher, rows, *, k: int, batch: int = 4) -> dict:
    """Teacher over equal-length rows: {"hidden": [N,S,d] fp16, "logp": [N,S,k] fp32 top-k, "idx": [N,S,k] int32}."""
    import torch

    hs, logps, idxs = [], [], []
    with torch.inference_mode():
        for i in range(0, len(rows), batch):
            x = torch.tensor(rows[i : i + batch], dtype=torch.long)
            h = teacher.model(input_ids=x, use_cache=False).last_hidden_state
            v, ix = torch.log_softmax(teacher.lm_head(h).float(), dim=-1).topk(k, dim=-1)
            hs.append(h.to(torch.float16))
            logps.append(v)
            idxs.append(ix.to(torch.int32))
    return {"hidden": torch.cat(hs), "logp": torch.cat(logps), "idx": torch.cat(idxs)}


def teacher_generate(teacher, tokenizer, prompts, *, max_new_tokens: int, eos: int, pad: int) -> list[tuple[list, int]]:
    """Greedy teacher answers to chat prompts: (prompt + answer ids, answer start) per prompt."""
    import torch

    enc = [tokenizer.encode(CHAT_FORMAT.format(p), add_special_tokens=False).ids for p in prompts]
    if not enc:
        return []
    width = max(len(e) for e in enc)
    x = torch.tensor([[pad] * (width - len(e)) + e for e in enc], dtype=torch.long)
    mask = torch.tensor([[0] * (width - len(e)) + [1] * len(e) for e in enc], dtype=torch.long)
    with torch.inference_mode():
        out = teacher.generate(
            input_ids=x,
            attention_mask=mask,
            max_new_tokens=max_new_tokens,
            min_new_tokens=1,
            do_sample=False,
            pad_token_id=pad,
            eos_token_id=eos,
            top_p=None,
            top_k=None,
            temperature=None,
        )
    res = []
    for b, e in enumerate(enc):
        ans = out[b, width:].tolist()
        if eos in ans:
            ans = ans[: ans.index(eos) + 1]
        res.append((e + ans, len(e)))
    return res


def hidden_basis(h, rank: int):
    """Top `rank` eigenvectors [d, rank] of the uncentred second moment of h [M, d], sign-normalised."""
    import torch

    h = h.double()
    evals, evecs = torch.linalg.eigh(h.T @ h / max(1, h.shape[0]))
    v = evecs[:, torch.argsort(evals, descending=True)[:rank]]
    return (v * torch.sign(v.gather(0, v.abs().argmax(0, keepdim=True)))).float()


def draft_config(
    teacher_cfg: dict, *, hidden: int, layers: int, heads: int, kv_heads: int, head_dim: int, intermediate: int
):
    from transformers import LlamaConfig

    keep = (
        "vocab_size",
        "bos_token_id",
        "eos_token_id",
        "pad_token_id",
        "unk_token_id",
        "rms_norm_eps",
        "max_position_embeddings",
        "rope_parameters",
        "rope_theta",
        "rope_scaling",
        "hidden_act",
    )
    cfg = {k: teacher_cfg[k] for k in keep if k in teacher_cfg}
    cfg.update(
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        intermediate_size=intermediate,
        tie_word_embeddings=True,
        attention_bias=False,
        mlp_bias=False,
        use_cache=True,
        architectures=["LlamaForCausalLM"],
    )
    return LlamaConfig(**cfg)


def _lr_at(step: int, steps: int, lr: float, warmup: int) -> float:
    if step < warmup:
        return lr * (step + 1) / warmup
    t = (step - warmup) / max(1, steps - warmup)
    return lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t)))


def top1_agreement(model, seqs, targets, positions=None) -> tuple[int, int]:
    """(agreeing, total) positions where the full-vocabulary argmax equals targets[i] at positions[i] of seqs[i]."""
    import torch

    agree = total = 0
    with torch.inference_mode():
        for i, s in enumerate(seqs):
            x = torch.tensor([s], dtype=torch.long)
            am = model(input_ids=x, use_cache=False).logits[0].argmax(-1)
            pos = positions[i] if positions is not None else list(range(len(s)))
            t = torch.tensor(targets[i], dtype=torch.long)
            agree += int((am[pos] == t).sum())
            total += len(pos)
    return agree, total


def decode_step_ms(models, *, vocab: int, prompt_len: int = 32, steps: int = 16) -> list[float]:
    """Median ms of a single-token KV-cache decode step per model, interleaved so both see the same load."""
    import inspect

    import torch

    x = torch.randint(3, vocab, (1, prompt_len), generator=torch.Generator().manual_seed(0))
    state, times = [], [[] for _ in models]
    # transformers 5.x calls the KV cache `cache`; 4.x only knows `past_key_values`
    new_api = "cache" in inspect.signature(models[0].forward).parameters

    def cache_of(out):
        return out["cache"] if new_api else out["past_key_values"]

    with torch.inference_mode():
        for m in models:
            out = m(input_ids=x, use_cache=True)
            state.append((cache_of(out), out.logits[:, -1:].argmax(-1)))
        for _ in range(steps + 2):
            for i, m in enumerate(models):
                past, nxt = state[i]
                kw = {"cache": past} if new_api else {"past_key_values": past}
                t = time.perf_counter()
                out = m(input_ids=nxt, use_cache=True, **kw)
                times[i].append(time.perf_counter() - t)
                state[i] = (cache_of(out), out.logits[:, -1:].argmax(-1))
    return [statistics.median(ts[2:]) * 1e3 for ts in times]


def forward_macs(cfg) -> int:
    """Weight multiply-accumulates per token, LM head included."""
    h, hd = cfg.hidden_size, getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    attn = h * hd * (2 * cfg.num_attention_heads + 2 * cfg.num_key_value_heads)
    mlp = 3 * h * cfg.intermediate_size
    return cfg.num_hidden_layers * (attn + mlp) + cfg.vocab_size * h


def _pad_rows(seqs: list[list[int]], length: int, pad: int) -> list[list[int]]:
    return [(q[:length] + [pad] * (length - len(q[:length]))) for q in seqs]


@dataclass
class Teacher:
    lm: Any  # LlamaForCausalLM, fp32, eval mode
    tok: Any  # tokenizers.Tokenizer
    config_json: dict
    eos: int
    pad: int


@dataclass
class TeacherRows:
    """Teacher-labelled rows, stacked: R rows of seq_len positions."""

    x: Any  # [R, S] token ids
    p: Any  # [R, S, k] renormalised teacher top-k probabilities
    ix: Any  # [R, S, k]
    m: Any  # [R, S] bool: the positions to learn
    h: Any  # [R, S, d_teacher] fp16


@dataclass
class Data:
    raw: list[list[int]]  # seq_len + 1 tokens each
    ev: list[list[int]]
    ev_top1: Any  # [E, S]
    teacher_chunks: int
    chat_gen: list[tuple[list[int], int]]  # (prompt + answer, answer start)
    ev_chat: list[tuple[list[int], int]]
    rows: TeacherRows | None


@dataclass
class Draft:
    lm: Any
    init: str  # as used: "random" when the requested one does not apply
    basis: Any  # [d_teacher, hidden]
    mse_norm: float | None  # None: no hidden-state MSE


@dataclass
class TrainHistory:
    train_vocab: int
    losses: list[float] = field(default_factory=list)
    kls: list[float] = field(default_factory=list)
    raw_losses: list[float] = field(default_factory=list)
    curve: list[list] = field(default_factory=list)  # [step, held-out code top-1]


class _Clock:
    def __init__(self, log):
        self.log, self.phases = log, {}
        self.start = self.t = time.monotonic()

    def lap(self, name: str) -> None:
        self.phases[name] = round(time.monotonic() - self.t, 2)
        self.log(f"{name}: {self.phases[name]:.1f}s")
        self.t = time.monotonic()

    def total(self) -> float:
        return round(time.monotonic() - self.start, 1)


def read_teacher_config(teacher_dir: Path) -> dict:
    """The teacher's config.json; raises DistillError unless it is a Llama directory with a tokenizer.json."""
    if not (teacher_dir / "config.json").is_file():
        raise DistillError(f"{teacher_dir}: no config.json (expected a Hugging Face model directory)")
    if not (teacher_dir / "tokenizer.json").is_file():
        raise DistillError(f"{teacher_dir}: no tokenizer.json (the draft copies the teacher's tokenizer)")
    try:
        tcfg = json.loads((teacher_dir / "config.json").read_text())
    except ValueError as e:
        raise DistillError(f"{teacher_dir / 'config.json'}: not valid JSON ({e})") from None
    if tcfg.get("model_type") != "llama" and "LlamaForCausalLM" not in (tcfg.get("architectures") or []):
        raise DistillError(f"{teacher_dir}: teacher must be a Llama model, got {tcfg.get('model_type')!r}")
    return tcfg


def load_teacher(teacher_dir: Path, tcfg: dict) -> Teacher:
    import torch
    from tokenizers import Tokenizer
    from transformers import LlamaForCausalLM

    tok = Tokenizer.from_file(str(teacher_dir / "tokenizer.json"))
    try:
        lm = LlamaForCausalLM.from_pretrained(str(teacher_dir), dtype=torch.float32).eval()
    except (OSError, ValueError, RuntimeError) as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise DistillError(f"{teacher_dir}: cannot load the teacher ({first})") from None
    eos = tcfg.get("eos_token_id")
    eos = eos[0] if isinstance(eos, list) else eos
    pad = tcfg.get("pad_token_id")
    return Teacher(lm, tok, tcfg, eos, eos if pad is None else pad)


def load_text(cfg: DistillConfig, tok) -> tuple[list[list[int]], list[list[int]]]:
    """(raw training chunks, held-out chunks) from the corpus."""
    files = list(cfg.corpus_files) if cfg.corpus_files is not None else stdlib_files()
    if not files:
        raise DistillError("empty training corpus")
    raw, ev = load_corpus(
        tok,
        files,
        seq_len=cfg.seq_len,
        train_chunks=max(cfg.raw_chunks, cfg.teacher_chunks),
        eval_chunks=cfg.eval_chunks,
        seed=cfg.seed,
    )
    if not raw:
        raise DistillError(f"corpus too small: no training chunk of {cfg.seq_len + 1} tokens")
    return raw, ev


def label_with_teacher(cfg: DistillConfig, teacher: Teacher, raw: list[list[int]], ev: list[list[int]]) -> Data:
    """Run the teacher once over the code chunks and its own greedy chat answers."""
    tch = [c[: cfg.seq_len] for c in raw[: cfg.teacher_chunks]] if cfg.teacher_fraction > 0 else []
    code_lab = teacher_label(teacher.lm, tch, k=cfg.topk) if tch else None
    train_prompts = list(TRAIN_CHAT_PROMPTS[: cfg.chat_prompts]) if cfg.teacher_fraction > 0 else []
    gen = teacher_generate(
        teacher.lm,
        teacher.tok,
        train_prompts + list(EVAL_CHAT_PROMPTS[: cfg.eval_chat_prompts]),
        max_new_tokens=cfg.chat_tokens,
        eos=teacher.eos,
        pad=teacher.pad,
    )
    chat_gen, ev_chat = gen[: len(train_prompts)], gen[len(train_prompts) :]
    chat_width = min(cfg.seq_len, max((len(q) for q, _ in chat_gen), default=0))
    chat_lab = (
        teacher_label(teacher.lm, _pad_rows([q for q, _ in chat_gen], chat_width, teacher.pad), k=cfg.topk)
        if chat_gen
        else None
    )
    ev_top1 = teacher_label(teacher.lm, ev, k=1)["idx"][..., 0].long() if ev else None
    rows = teacher_rows(tch, code_lab, chat_gen, chat_lab, seq_len=cfg.seq_len, pad=teacher.pad)
    return Data(raw, ev, ev_top1, len(tch), chat_gen, ev_chat, rows)


def teacher_rows(
    tch, code_lab: dict | None, chat_gen, chat_lab: dict | None, *, seq_len: int, pad: int
) -> TeacherRows | None:
    """Stack labelled code chunks and chat answers into [R, seq_len] rows; None when there are none."""
    import torch

    parts = []  # (ids, logp, idx, hidden, mask)
    if code_lab is not None:
        parts.append(
            (
                torch.tensor(tch, dtype=torch.long),
                code_lab["logp"],
                code_lab["idx"],
                code_lab["hidden"],
                torch.ones(len(tch), seq_len, dtype=torch.bool),
            )
        )
    if chat_lab is not None:
        # chat rows are chat_width wide: pad to seq_len so they stack with the code rows
        n_rows, chat_width, topk = chat_lab["logp"].shape
        x = torch.full((n_rows, seq_len), pad, dtype=torch.long)
        lp = torch.zeros(n_rows, seq_len, topk)
        ix = torch.zeros(n_rows, seq_len, topk, dtype=torch.int32)
        hh = torch.zeros(n_rows, seq_len, chat_lab["hidden"].shape[-1], dtype=torch.float16)
        m = torch.zeros(n_rows, seq_len, dtype=torch.bool)
        for r, (q, a0) in enumerate(chat_gen):
            n = min(len(q), chat_width)
            x[r, :n] = torch.tensor(q[:n])
            lp[r, :chat_width], ix[r, :chat_width], hh[r, :chat_width] = (
                chat_lab["logp"][r],
                chat_lab["idx"][r],
                chat_lab["hidden"][r],
            )
            m[r, a0 - 1 : n - 1] = True  # positions whose next token is an answer token
        parts.append((x, lp, ix, hh, m))
    if not parts:
        return None
    x, lp, ix, hh, m = (torch.cat(t) for t in zip(*parts))
    return TeacherRows(x=x, p=torch.softmax(lp, dim=-1), ix=ix.long(), m=m, h=hh)


def init_draft(cfg: DistillConfig, teacher: Teacher, rows: TeacherRows | None) -> Draft:
    """A small Llama whose tied head starts as a low-rank slice of the teacher's head (see module docstring)."""
    import torch
    from transformers import LlamaForCausalLM

    heads = cfg.heads or max(1, round(cfg.hidden / cfg.head_dim))
    lcfg = draft_config(
        teacher.config_json,
        hidden=cfg.hidden,
        layers=cfg.layers,
        heads=heads,
        kv_heads=min(cfg.kv_heads, heads),
        head_dim=cfg.head_dim,
        intermediate=cfg.intermediate or 4 * cfg.hidden,
    )
    torch.manual_seed(cfg.seed)
    lm = LlamaForCausalLM(lcfg)
    temb = teacher.lm.model.embed_tokens.weight.detach().float()
    fits = cfg.hidden <= teacher.lm.config.hidden_size
    basis, init_used = None, "random"
    if cfg.init == "hidden_pca" and rows is not None and fits:
        basis, init_used = hidden_basis(rows.h[rows.m].float(), cfg.hidden), cfg.init  # [d, hidden]
    elif cfg.init == "embedding_pca" and fits:
        basis, init_used = hidden_basis(temb, cfg.hidden), cfg.init
    target_scale = None
    with torch.no_grad():
        if basis is not None:
            lm.model.embed_tokens.weight.copy_(temb @ basis)
        if basis is not None and rows is not None:
            proj = rows.h[rows.m].float() @ basis
            target_scale = proj.pow(2).mean(0).sqrt()
            lm.model.norm.weight.copy_(target_scale)
        else:
            lm.model.norm.weight.fill_(0.1)  # keep initial tied logits O(1)
    lm.tie_weights()
    mse_on = basis is not None and rows is not None and cfg.mse_weight > 0
    return Draft(lm, init_used, basis, float(target_scale.pow(2).mean()) if mse_on else None)


def training_vocab(raw_t, rows: TeacherRows | None, *, vocab: int, cap: int):
    """(cand, others, rows): the `cap` most-used token ids, the rest, and rows renormalised over cand."""
    import torch

    score = torch.bincount(raw_t[:, 1:].flatten(), minlength=vocab).double()
    if rows is not None:
        score.index_add_(0, rows.ix[rows.m].flatten(), rows.p[rows.m].flatten().double())
    order = torch.sort(-score, stable=True).indices
    cand = torch.sort(order[: min(cap, int((score > 0).sum()))]).values
    in_cand = torch.zeros(vocab, dtype=torch.bool)
    in_cand[cand] = True
    others = (~in_cand).nonzero().flatten()
    if rows is not None:
        p = rows.p * in_cand[rows.ix]
        rows = replace(rows, p=p / p.sum(-1, keepdim=True).clamp_min(1e-12))
    return cand, others, rows


def _teacher_step_mask(steps: int, n_teacher: int) -> list[bool]:
    """n_teacher teacher steps spread evenly, so the small teacher set is not overfitted early."""
    mask = [False] * steps
    for j in range(n_teacher):
        mask[min(steps - 1, int((j + 0.5) * steps / n_teacher))] = True
    return mask


class _Batches:
    """Seeded row indices without replacement; reshuffles when too few are left."""

    def __init__(self, n: int, gen):
        import torch

        self.n, self.gen = n, gen
        self.perm, self.pos = torch.randperm(n, generator=gen), 0

    def take(self, k: int):
        import torch

        if self.pos + k > self.n:
            self.perm, self.pos = torch.randperm(self.n, generator=self.gen), 0
        sel = self.perm[self.pos : self.pos + k]
        self.pos += k
        return sel


def _teacher_loss(cfg: DistillConfig, draft: Draft, rows: TeacherRows, sel, w, pos_of):
    """(loss, KL) on teacher rows sel; w: [Vs, h] step vocabulary rows, pos_of: token id -> row of w."""
    import torch

    m = rows.m[sel]
    g = draft.lm.model(input_ids=rows.x[sel], use_cache=False).last_hidden_state[m]
    logq = torch.log_softmax(g @ w.T, dim=-1)
    p = rows.p[sel][m]
    # soft CE to the teacher top-k; minus the teacher entropy it is the KL
    ce = -(p * logq.gather(1, pos_of[rows.ix[sel][m]].clamp_min(0))).sum(-1).mean()
    kl = ce.detach() + (p * p.clamp_min(1e-12).log()).sum(-1).mean()
    loss = cfg.kl_weight * ce
    if draft.mse_norm is not None:
        loss = loss + cfg.mse_weight * (g - rows.h[sel][m].float() @ draft.basis).pow(2).mean() / draft.mse_norm
    return loss, kl


def _raw_loss(cfg: DistillConfig, lm, xb, w, pos_of, n_cand: int):
    """Next-token CE on raw chunks xb [B, S+1]; targets outside cand are ignored."""
    import torch

    g = lm.model(input_ids=xb[:, :-1], use_cache=False).last_hidden_state
    logits = g.reshape(-1, g.shape[-1]) @ w.T
    tgt = pos_of[xb[:, 1:].reshape(-1)]
    tgt[tgt >= n_cand] = -1
    return cfg.raw_weight * torch.nn.functional.cross_entropy(logits, tgt, ignore_index=-1)


def heldout_code_top1(lm, data: Data) -> float | None:
    """Share of held-out code positions where the draft's argmax is the teacher's."""
    if data.ev_top1 is None:
        return None
    a, n = top1_agreement(lm, data.ev, [r.tolist() for r in data.ev_top1])
    return a / n


def train(cfg: DistillConfig, draft: Draft, data: Data, *, vocab: int, log) -> TrainHistory:
    """Alternate teacher and raw steps; negatives are sampled per step so unseen rows are pushed down."""
    import torch

    raw_t = torch.tensor(data.raw, dtype=torch.long)  # [N, S+1]
    cand, others, rows = training_vocab(raw_t, data.rows, vocab=vocab, cap=cfg.train_vocab)
    pos_of = torch.full((vocab,), -1, dtype=torch.long)
    lm, emb = draft.lm, draft.lm.model.embed_tokens.weight
    opt = torch.optim.AdamW(lm.parameters(), lr=cfg.lr, betas=(0.9, 0.95), weight_decay=0.0)
    gen = torch.Generator().manual_seed(cfg.seed)
    warmup = max(1, cfg.steps // 20)
    is_teacher = _teacher_step_mask(cfg.steps, int(round(cfg.steps * cfg.teacher_fraction)) if rows is not None else 0)
    raw_batches = _Batches(len(data.raw), gen)
    teacher_batches = _Batches(rows.x.shape[0], gen) if rows is not None else None
    hist = TrainHistory(train_vocab=int(len(cand)))
    lm.train()
    for step in range(cfg.steps):
        for gp in opt.param_groups:
            gp["lr"] = _lr_at(step, cfg.steps, cfg.lr, warmup)
        neg = (
            others[torch.randint(0, len(others), (min(cfg.neg_samples, len(others)),), generator=gen)]
            if len(others)
            else others
        )
        voc = torch.cat([cand, neg])
        pos_of[voc] = torch.arange(len(voc))
        w = emb[voc]  # [Vs, h]
        if is_teacher[step]:
            sel = teacher_batches.take(min(cfg.batch, rows.x.shape[0]))
            loss, kl = _teacher_loss(cfg, draft, rows, sel, w, pos_of)
        else:
            loss, kl = _raw_loss(cfg, lm, raw_t[raw_batches.take(cfg.batch)], w, pos_of, len(cand)), None
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(lm.parameters(), 1.0)
        opt.step()
        pos_of[voc] = -1
        hist.losses.append(float(loss.detach()))
        if kl is None:
            hist.raw_losses.append(hist.losses[-1])
        else:
            hist.kls.append(float(kl))
        if step % 50 == 0 or step == cfg.steps - 1:
            log(f"step {step} {'teacher' if is_teacher[step] else 'raw'} loss {hist.losses[-1]:.3f}")
        if cfg.eval_every and (step + 1) % cfg.eval_every == 0 and step + 1 < cfg.steps:
            lm.eval()
            hist.curve.append([step + 1, heldout_code_top1(lm, data)])
            lm.train()
            log(f"step {step + 1} held-out code top-1 {hist.curve[-1][1]}")
    lm.eval()
    return hist


def evaluate(lm, data: Data, hist: TrainHistory, *, steps: int, log) -> dict:
    """Held-out argmax agreement with the teacher on code and chat answers."""
    res: dict = {}
    if data.ev_top1 is not None:
        res["heldout_code_top1"] = heldout_code_top1(lm, data)
        res["heldout_code_positions"] = int(data.ev_top1.numel())
        if hist.curve:
            res["heldout_code_curve"] = hist.curve + [[steps, res["heldout_code_top1"]]]
    if data.ev_chat:
        seqs = [q[:-1] for q, _ in data.ev_chat]
        poss = [list(range(a0 - 1, len(q) - 1)) for q, a0 in data.ev_chat]
        a, n = top1_agreement(lm, seqs, [q[a0:] for q, a0 in data.ev_chat], poss)
        res["chat_top1"] = a / n
        res["chat_positions"] = n
    log("held-out agreement: " + ", ".join(f"{k} {v:.3f}" for k, v in res.items() if k.endswith("top1")))
    return res


def measure_cost(draft_lm, teacher_lm, *, timed: bool) -> dict:
    """Weight MACs per token and, if timed, decode-step times of draft and teacher."""
    cost = {
        "draft_macs_per_token": forward_macs(draft_lm.config),
        "teacher_macs_per_token": forward_macs(teacher_lm.config),
    }
    cost["macs_ratio"] = cost["draft_macs_per_token"] / cost["teacher_macs_per_token"]
    if timed:
        dm, tm = decode_step_ms([draft_lm, teacher_lm], vocab=teacher_lm.config.vocab_size)
        cost.update(draft_decode_ms=round(dm, 3), teacher_decode_ms=round(tm, 3), time_ratio=dm / tm)
    return cost


def save(cfg: DistillConfig, lm) -> None:
    """Write the draft and copy the teacher's tokenizer files."""
    import torch

    cfg.out_dir.mkdir(parents=True, exist_ok=True)
    if cfg.dtype != "float32":
        lm = lm.to(getattr(torch, cfg.dtype))
    lm.save_pretrained(str(cfg.out_dir), safe_serialization=True)
    for name in TOKENIZER_FILES:
        if (cfg.teacher_dir / name).is_file():
            shutil.copy2(cfg.teacher_dir / name, cfg.out_dir / name)


def _ends(xs: list[float]) -> tuple[float | None, float | None]:
    """Means of the first and last ~10% (1..10) values."""
    if not xs:
        return None, None
    k = max(1, min(10, len(xs) // 10))
    return sum(xs[:k]) / k, sum(xs[-k:]) / k


def build_report(
    cfg: DistillConfig, data: Data, draft: Draft, hist: TrainHistory, res: dict, cost: dict, clock: _Clock
) -> dict:
    lcfg, losses = draft.lm.config, hist.losses
    first_loss, final_loss = _ends(losses)
    first_kl, final_kl = _ends(hist.kls)
    first_ce, final_ce = _ends(hist.raw_losses)
    every = max(1, cfg.steps // 20)
    return {
        "teacher": str(cfg.teacher_dir),
        "hidden": cfg.hidden,
        "layers": cfg.layers,
        "heads": lcfg.num_attention_heads,
        "kv_heads": lcfg.num_key_value_heads,
        "head_dim": cfg.head_dim,
        "intermediate": lcfg.intermediate_size,
        "init": draft.init,
        "steps": cfg.steps,
        "seq_len": cfg.seq_len,
        "seed": cfg.seed,
        "lr": cfg.lr,
        "batch": cfg.batch,
        "topk": cfg.topk,
        "teacher_chunks": data.teacher_chunks,
        "teacher_fraction": cfg.teacher_fraction,
        "kl_weight": cfg.kl_weight,
        "mse_weight": cfg.mse_weight if draft.mse_norm is not None else 0.0,
        "raw_chunks": len(data.raw),
        "chat_train_prompts": len(data.chat_gen),
        "train_vocab": hist.train_vocab,
        "train_vocab_cap": cfg.train_vocab,
        "params": sum(p.numel() for p in draft.lm.parameters()),
        "first_loss": first_loss,
        "final_loss": final_loss,
        "first_teacher_kl": first_kl,
        "final_teacher_kl": final_kl,
        "first_raw_ce": first_ce,
        "final_raw_ce": final_ce,
        "loss_curve": [[i, round(losses[i], 4)] for i in range(0, cfg.steps, every)]
        + [[cfg.steps - 1, round(losses[-1], 4)]],
        **res,
        "cost": cost,
        "phases_seconds": clock.phases,
        "seconds": clock.total(),
    }


def run(cfg: DistillConfig, log=None) -> dict:
    """Distill a draft from cfg.teacher_dir into cfg.out_dir; returns the report (also written as REPORT_NAME)."""
    tcfg = read_teacher_config(cfg.teacher_dir)
    cfg.validate()
    import torch

    log = log or (lambda *a: None)
    torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    clock = _Clock(log)
    teacher = load_teacher(cfg.teacher_dir, tcfg)
    raw, ev = load_text(cfg, teacher.tok)
    clock.lap("load")
    data = label_with_teacher(cfg, teacher, raw, ev)
    clock.lap("teacher")
    draft = init_draft(cfg, teacher, data.rows)
    hist = train(cfg, draft, data, vocab=teacher.lm.config.vocab_size, log=log)
    clock.lap("train")
    res = evaluate(draft.lm, data, hist, steps=cfg.steps, log=log)
    clock.lap("eval")
    cost = measure_cost(draft.lm, teacher.lm, timed=cfg.measure_cost)
    clock.lap("cost")
    save(cfg, draft.lm)
    clock.lap("save")
    report = build_report(cfg, data, draft, hist, res, cost, clock)
    (cfg.out_dir / REPORT_NAME).write_text(json.dumps(report, indent=2))
    return report


def _parser() -> argparse.ArgumentParser:
    defaults = {f.name: f.default for f in fields(DistillConfig)}
    ap = argparse.ArgumentParser(description="Distill a small draft model from a Llama teacher directory.")
    ap.add_argument(
        "--teacher",
        required=True,
        help="Hugging Face directory of the target (config.json, model.safetensors, tokenizer.json)",
    )
    ap.add_argument("--output_dir", required=True)
    for name in CLI_OPTIONS:
        d = defaults[name]
        ap.add_argument(f"--{name}", type=type(d), default=d, help=f"default {d}")
    ap.add_argument("-q", "--quiet", action="store_true", help="no progress lines on stderr")
    return ap


def main(argv: list[str] | None = None) -> int:
    a = _parser().parse_args(argv)
    log = None if a.quiet else (lambda msg: print(f"[distill] {msg}", file=sys.stderr, flush=True))
    try:
        report = run(
            DistillConfig(Path(a.teacher), Path(a.output_dir), **{k: getattr(a, k) for k in CLI_OPTIONS}), log=log
        )
    except DistillError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(
        json.dumps(
            {
                k: report.get(k)
                for k in ("steps", "seconds", "final_loss", "heldout_code_top1", "chat_top1", "params", "cost")
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
