"""Train an EAGLE-3 draft head for a target, offline, by self-distillation (a reproducible build step).

Data: the target's own greedy (and sampled) answers to TRAIN_PROMPTS, with the aux-layer features and the target's
argmax (the greedy acceptance label), from the target quantized as served. Training unrolls `ttt` steps (EAGLE-3's
training-time test, loss weights 0.8^j) over a draft vocabulary of the most frequent labels; the head starts from the
target's LM-head rows, final norm and last MLP. Why not Model Optimizer: docs/reference-engine.md "EAGLE-3 head".
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Callable, Optional

import torch
import torch.nn.functional as F

from ..errors import TrtSpecError
from ..records.defaults import EAGLE_DRAFT_VOCAB, EAGLE_TRAIN_STEPS
from .eagle import REPORT_NAME, Eagle3Head, HeadConfig, default_aux_layers

# Disjoint from the benchmark sets, tests/data/*_heldout.jsonl and the distilled draft's prompts.
_CODE_TASKS = (
    "reverses a string",
    "returns the second largest number in a list",
    "checks whether a number is prime",
    "computes the factorial of n recursively",
    "merges two dictionaries",
    "removes all whitespace from a string",
    "returns the median of a list of numbers",
    "finds the longest word in a sentence",
    "rotates a list by k positions",
    "counts how many times each word appears in a text",
    "checks whether a list is sorted",
    "converts a binary string to an integer",
    "returns all even numbers from a list",
    "capitalizes every word in a string",
    "computes the average of a list, returning 0 for an empty list",
    "finds the intersection of two lists",
    "returns the n-th triangular number",
    "validates an email address with a regular expression",
    "parses a date string in the format YYYY-MM-DD",
    "reads a JSON file and returns its contents",
    "writes a list of rows to a CSV file",
    "computes the power set of a list",
    "finds the mode of a list",
    "converts kilometers to miles",
    "returns the running sum of a list",
    "checks whether parentheses are balanced",
    "computes the dot product of two vectors",
    "removes None values from a dictionary",
    "groups a list of words by their first letter",
    "returns the indices of all occurrences of a value in a list",
    "implements insertion sort",
    "implements quicksort",
    "implements merge sort",
    "computes the nth power of two",
    "returns the unique characters of a string in order",
    "sums all numbers in a nested list",
    "checks whether a year string is a valid four-digit number",
    "truncates a string to n characters with an ellipsis",
    "computes compound interest",
    "converts a list of tuples to a dictionary",
)
_CLASSES = (
    "BankAccount with deposit, withdraw and balance methods",
    "Rectangle with area and perimeter methods",
    "TodoList with add, remove and list methods",
    "Timer that measures elapsed time as a context manager",
    "Matrix with add and multiply methods",
    "LRUCache with get and put methods",
    "Student with a name and a list of grades and an average method",
    "Point with a distance method",
)
_CONCEPTS = (
    "a Python list comprehension",
    "the difference between `==` and `is` in Python",
    "what a lambda function is",
    "how exceptions work in Python",
    "what a virtual environment is",
    "the difference between a process and a thread",
    "what an API is",
    "what Big-O notation means",
    "what a database index is",
    "how garbage collection works",
    "what a REST API is",
    "the difference between a stack and a queue",
    "what version control is",
    "what a compiler does",
    "what object-oriented programming is",
    "what a linked list is",
    "how HTTP cookies work",
    "what JSON is",
    "what unit tests are for",
    "what a race condition is",
    "what photosynthesis is",
    "how the heart pumps blood",
    "why the seasons change",
    "what inflation is",
    "how a refrigerator keeps food cold",
    "what causes thunder",
    "how airplanes stay in the air",
    "what DNA does",
    "why we need sleep",
    "how solar panels work",
    "what a black hole is",
    "how memory works in the human brain",
    "what climate change is",
    "how a bicycle stays upright",
    "what an ecosystem is",
    "why leaves change color in autumn",
    "how electricity reaches a home",
    "what the water cycle is",
    "how a camera captures an image",
    "what gravity is",
)
_ASKS = (
    "Give me five tips for learning a new language.",
    "Write a haiku about autumn.",
    "List three healthy breakfast ideas.",
    "Write a short thank-you note to a teacher.",
    "What are the pros and cons of working from home?",
    "Describe a good morning routine.",
    "Give me a simple recipe for pancakes.",
    "How can I improve my focus while studying?",
    "Write a limerick about a cat.",
    "What makes a good presentation?",
    "Suggest three names for a coffee shop.",
    "How do I start running as a beginner?",
    "Write a two-line motto for a library.",
    "What should I consider when buying a laptop?",
    "Describe the city of Rome in three sentences.",
    "Give me four ideas for a rainy weekend.",
    "How do I write a good cover letter?",
    "What are some ways to reduce stress?",
    "Write a short product description for a water bottle.",
    "Explain the rules of chess briefly.",
)
TRAIN_PROMPTS: tuple[str, ...] = (
    *(f"Write a Python function that {t}." for t in _CODE_TASKS),
    *(f"Write a Python class `{c.split()[0]}` {c[len(c.split()[0]) + 1 :]}." for c in _CLASSES),
    *(f"Explain {c}." for c in _CONCEPTS),
    *_ASKS,
)


SAMPLE_TEMPERATURE = 0.7  # near the target's greedy path, not on it


class TrainError(TrtSpecError, ValueError):
    """Bad input to the training step (one line on the CLI)."""


@dataclass(frozen=True)
class TrainConfig:
    """Every knob of one training run; the CLI and the build config read its defaults."""

    target_dir: Path
    out_dir: Path
    weights: str = "fp8"  # as served: fp8 | bf16 | fp16 | fp32
    draft_vocab: int = EAGLE_DRAFT_VOCAB
    steps: int = EAGLE_TRAIN_STEPS
    ttt: int = 3  # unrolled drafting steps
    seq_len: int = 192  # fits a prompt + a 128-token answer
    batch: int = 4
    lr: float = 3e-3
    seed: int = 0
    prompts: int = len(TRAIN_PROMPTS)
    answer_tokens: int = 128
    samples_per_prompt: int = 2  # one greedy, the rest sampled
    gen_batch: int = 24
    threads: int = 2

    def __post_init__(self) -> None:
        object.__setattr__(self, "target_dir", Path(self.target_dir))
        object.__setattr__(self, "out_dir", Path(self.out_dir))

    def validate(self) -> None:
        if self.steps < 1 or self.ttt < 1 or self.seq_len < 8 or self.batch < 1 or self.draft_vocab < 16:
            raise TrainError(
                f"bad sizes: steps={self.steps} ttt={self.ttt} seq_len={self.seq_len} batch={self.batch} "
                f"draft_vocab={self.draft_vocab}"
            )
        if not 1 <= self.prompts <= len(TRAIN_PROMPTS):
            raise TrainError(f"prompts {self.prompts}: 1..{len(TRAIN_PROMPTS)} training prompts are bundled")
        if not (self.target_dir / "config.json").is_file():
            raise TrainError(
                f"{self.target_dir}: no config.json; point --target at the target's Hugging Face directory"
            )


CLI_OPTIONS = (
    "weights",
    "draft_vocab",
    "steps",
    "ttt",
    "seq_len",
    "batch",
    "lr",
    "seed",
    "prompts",
    "answer_tokens",
    "samples_per_prompt",
    "gen_batch",
    "threads",
)


def load_target(cfg: TrainConfig):
    """(model quantized as served, HF config, tokenizer)."""
    from transformers import AutoTokenizer

    from .export import dequantize_fp8, export_state_dict
    from .model import ReferenceModel, load_hf_state_dict

    tcfg = json.loads((cfg.target_dir / "config.json").read_text())
    stored, _ = export_state_dict(load_hf_state_dict(cfg.target_dir), cfg.weights)
    sd = {
        n: (dequantize_fp8(t, stored[n + ".scale"]) if n + ".scale" in stored else t.float())
        for n, t in stored.items()
        if not n.endswith(".scale")
    }
    return ReferenceModel.from_state_dict(tcfg, sd), tcfg, AutoTokenizer.from_pretrained(str(cfg.target_dir))


def chat_ids(tokenizer, prompt: str) -> list[int]:
    """The prompt in the chat template, or plain without one."""
    if not getattr(tokenizer, "chat_template", None):
        return list(tokenizer.encode(prompt))
    return list(
        tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=True, return_dict=False
        )
    )


@torch.inference_mode()
def generate_labelled(
    model,
    prompts: list[list[int]],
    aux: tuple[int, ...],
    *,
    max_new: int,
    end_id: Optional[int],
    batch: int,
    log: Callable[[str], None],
    temperature: float = 0.0,
    seed: int = 0,
) -> list[tuple[list[int], torch.Tensor, torch.Tensor]]:
    """The target's answers with labels gathered on the way: (tokens, features [N, len(aux) * H], argmax [N]).

    Greedy, or sampled at `temperature`; the argmax is the label either way. The end token is not kept."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    t0 = time.monotonic()
    for b0 in range(0, len(prompts), batch):
        group = prompts[b0 : b0 + batch]
        caches = [model.new_cache(1, len(p) + max_new + 1) for p in group]
        seqs = [list(p) for p in group]
        feats: list[list[torch.Tensor]] = [[] for _ in group]
        tops: list[list[torch.Tensor]] = [[] for _ in group]
        feed = [list(p) for p in group]
        active = list(range(len(group)))
        while active:
            toks, pos, segs = [], [], []
            for i in active:
                start = len(seqs[i]) - len(feed[i])
                toks += feed[i]
                pos += range(start, start + len(feed[i]))
                segs.append((caches[i], len(feed[i])))
            logits, f = model.forward_packed(
                torch.tensor(toks), torch.tensor(pos), segs, torch.arange(len(toks)), aux_layers=aux
            )
            top = logits.argmax(-1)
            row, still = 0, []
            for i in active:
                n = len(feed[i])
                feats[i].append(f[row : row + n].clone())
                tops[i].append(top[row : row + n])
                nxt = int(top[row + n - 1])
                if temperature > 0:
                    probs = torch.softmax(logits[row + n - 1] / temperature, -1)
                    nxt = int(torch.multinomial(probs, 1, generator=gen))
                row += n
                if nxt == end_id or len(seqs[i]) - len(group[i]) >= max_new:
                    continue
                seqs[i].append(nxt)
                feed[i] = [nxt]
                still.append(i)
            active = still
        for i in range(len(group)):
            out.append((seqs[i], torch.cat(feats[i])[: len(seqs[i])], torch.cat(tops[i])[: len(seqs[i])]))
        n = sum(len(s) - len(p) for (s, _, _), p in zip(out, prompts))
        log(f"generate: {len(out)}/{len(prompts)} answers, {n} tokens, {time.monotonic() - t0:.0f} s")
    return out


def draft_vocabulary(labels: list[torch.Tensor], vocab: int, size: int) -> torch.Tensor:
    """The `size` most frequent labels, padded with the lowest unseen ids (BPE's commonest pieces), sorted by id."""
    counts = torch.bincount(torch.cat(labels), minlength=vocab)
    size = min(size, vocab)
    seen = int((counts > 0).sum())
    chosen = torch.topk(counts, min(size, seen)).indices
    if len(chosen) < size:
        unseen = torch.nonzero(counts == 0).flatten()[: size - len(chosen)]
        chosen = torch.cat((chosen, unseen))
    return torch.sort(chosen).values


def new_head(model, ids: torch.Tensor, seed: int) -> Eagle3Head:
    """A head over draft vocabulary `ids`, initialised from the target."""
    c = model.config
    torch.manual_seed(seed)
    head = Eagle3Head(
        HeadConfig(
            c.hidden_size,
            c.num_heads,
            c.num_kv_heads,
            c.head_dim,
            c.intermediate_size,
            c.vocab_size,
            len(ids),
            c.rms_norm_eps,
            c.rope_theta,
            default_aux_layers(c.num_layers),
        )
    )
    init_head(head, model, ids)
    return head


def init_head(head: Eagle3Head, model, ids: torch.Tensor) -> None:
    """Copy the target's LM-head rows, norm and last MLP; fc picks the last aux layer; o_proj starts at zero."""
    H = head.cfg.hidden_size
    with torch.no_grad():
        head.lm_head.weight.copy_(model.lm_head.w[ids])
        head.norm.weight.copy_(model.norm)
        last = model.layers[-1]
        gate, up = last.gate_up.w.chunk(2, 0)
        m = head.midlayer
        if gate.shape == m.mlp.gate_proj.weight.shape:
            m.mlp.gate_proj.weight.copy_(gate)
            m.mlp.up_proj.weight.copy_(up)
            m.mlp.down_proj.weight.copy_(last.down.w)
            m.post_attention_layernorm.weight.copy_(last.mlp_norm)
        head.fc.weight.zero_()
        head.fc.weight[:, -H:] = torch.eye(H)
        head.fc.weight.add_(torch.randn_like(head.fc.weight) * 0.01)
        m.self_attn.o_proj.weight.zero_()
        head.d2t.copy_(ids - torch.arange(len(ids)))
        head.t2d.zero_()
        head.t2d[ids] = True


@dataclass
class Rows:
    feats: torch.Tensor  # [R, T, F]
    tokens: torch.Tensor  # [R, T + ttt]: tokens[t + 1 + j] is read by step j at t (0 = padding)
    labels: torch.Tensor  # [R, T + ttt]: step j's draft-id target at t (-100: none)


def make_rows(seqs, labelled, to_draft: torch.Tensor, *, seq_len: int, ttt: int) -> Rows:
    """Cut every sequence into training rows of seq_len head positions."""
    F_ = labelled[0][0].shape[1]
    feats, toks, labs = [], [], []
    for s, (f, top) in zip(seqs, labelled):
        n = len(s)
        for a in range(0, n - 2, seq_len):
            T = min(seq_len, n - 1 - a)
            fr = torch.zeros(seq_len, F_)
            fr[:T] = f[a : a + T]
            tr = torch.zeros(seq_len + ttt + 1, dtype=torch.long)
            lr = torch.full((seq_len + ttt + 1,), -100, dtype=torch.long)
            end = min(n, a + seq_len + ttt + 1)
            tr[: end - a] = torch.tensor(s[a:end])
            lr[: end - a] = to_draft[top[a:end]]
            feats.append(fr)
            toks.append(tr)
            labs.append(lr)
    return Rows(torch.stack(feats), torch.stack(toks), torch.stack(labs))


def train(cfg: TrainConfig, head: Eagle3Head, embed: torch.Tensor, rows: Rows, log) -> list[float]:
    g = torch.Generator().manual_seed(cfg.seed)
    params = [p for p in head.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, betas=(0.9, 0.95), weight_decay=0.0)
    T, R = cfg.seq_len, rows.feats.shape[0]
    losses = []
    t0 = time.monotonic()
    order = torch.randperm(R, generator=g)
    pos = 0
    head.train()
    for step in range(cfg.steps):
        if pos + cfg.batch > R:
            order, pos = torch.randperm(R, generator=g), 0
        idx = order[pos : pos + cfg.batch]
        pos += cfg.batch
        lr = cfg.lr * min(1.0, (step + 1) / 20) * 0.5 * (1 + math.cos(math.pi * step / cfg.steps))
        for group in opt.param_groups:
            group["lr"] = lr
        emb_steps = [F.embedding(rows.tokens[idx, 1 + j : 1 + j + T], embed) for j in range(cfg.ttt)]
        outs = head.train_forward(rows.feats[idx], emb_steps)
        loss = 0.0
        for j, logits in enumerate(outs):
            target = rows.labels[idx, 1 + j : 1 + j + T]
            loss = loss + 0.8**j * F.cross_entropy(logits.flatten(0, 1), target.flatten(), ignore_index=-100)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        losses.append(float(loss.detach()))
        if (step + 1) % 25 == 0 or step + 1 == cfg.steps:
            log(
                f"train: step {step + 1}/{cfg.steps} loss {sum(losses[-25:]) / len(losses[-25:]):.3f} "
                f"({time.monotonic() - t0:.0f} s)"
            )
    head.eval()
    return losses


@torch.no_grad()
def step_accuracy(head: Eagle3Head, embed: torch.Tensor, rows: Rows, ttt: int, T: int) -> list[float]:
    """Per unrolled step, top-1 agreement with the target's argmax (teacher-forced)."""
    emb_steps = [F.embedding(rows.tokens[:, 1 + j : 1 + j + T], embed) for j in range(ttt)]
    outs = head.train_forward(rows.feats, emb_steps)
    accs = []
    for j, logits in enumerate(outs):
        target = rows.labels[:, 1 + j : 1 + j + T]
        ok = target != -100
        accs.append(float(((logits.argmax(-1) == target) & ok).sum() / ok.sum().clamp(min=1)))
    return accs


def run(cfg: TrainConfig, log: Optional[Callable[[str], None]] = None) -> dict:
    log = log or (lambda msg: None)
    cfg.validate()
    torch.manual_seed(cfg.seed)
    torch.set_num_threads(cfg.threads)
    t0 = time.monotonic()
    model, tcfg, tok = load_target(cfg)
    c = model.config
    aux = default_aux_layers(c.num_layers)
    log(
        f"target: {c.num_layers} layers, hidden {c.hidden_size}, vocab {c.vocab_size}, {cfg.weights} weights; "
        f"features from layers {list(aux)}"
    )
    prompts = [chat_ids(tok, p) for p in TRAIN_PROMPTS[: cfg.prompts]]
    end_id = tcfg.get("eos_token_id")
    end_id = end_id[0] if isinstance(end_id, list) else end_id
    t_gen = time.monotonic()
    seqs, labelled = _generate_data(cfg, model, prompts, aux, end_id, log)
    t_label = time.monotonic()
    ids, to_draft, covered = _draft_map(labelled, c.vocab_size, cfg.draft_vocab)
    # every 8th prompt is held out for the agreement report
    held = [i for i in range(len(seqs)) if (i % len(prompts)) % 8 == 7]
    trn = [i for i in range(len(seqs)) if (i % len(prompts)) % 8 != 7]
    rows = make_rows([seqs[i] for i in trn], [labelled[i] for i in trn], to_draft, seq_len=cfg.seq_len, ttt=cfg.ttt)
    hrows = make_rows([seqs[i] for i in held], [labelled[i] for i in held], to_draft, seq_len=cfg.seq_len, ttt=cfg.ttt)
    head = new_head(model, ids, cfg.seed)
    embed = model.embed.detach()
    t_train = time.monotonic()
    log(
        f"train: {rows.feats.shape[0]} rows of {cfg.seq_len} positions, draft vocabulary {len(ids)} "
        f"(covers {covered:.1%} of labels), {cfg.steps} steps"
    )
    losses = train(cfg, head, embed, rows, log)
    t_eval = time.monotonic()
    acc = step_accuracy(head, embed, hrows, cfg.ttt, cfg.seq_len)
    log(f"held-out agreement per step: {', '.join(f'{a:.3f}' for a in acc)}")
    tmp = cfg.out_dir.with_name(cfg.out_dir.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    head.save(tmp, tcfg)
    params = sum(p.numel() for p in head.parameters())
    report = {
        "architecture": "LlamaForCausalLMEagle3",
        "aux_layers": list(aux),
        "draft_vocab": len(ids),
        "label_coverage": round(covered, 4),
        "params": params,
        "bytes": (tmp / "model.safetensors").stat().st_size,
        "steps": cfg.steps,
        "first_loss": round(losses[0], 4),
        "final_loss": round(sum(losses[-25:]) / len(losses[-25:]), 4),
        "heldout_agreement_per_step": [round(a, 4) for a in acc],
        "heldout_sequences": len(held),
        "train_sequences": len(trn),
        "positions": sum(len(s) for s in seqs),
        "seconds": {
            "load": round(t_gen - t0, 1),
            "generate": round(t_label - t_gen, 1),
            "train": round(t_eval - t_train, 1),
            "total": round(time.monotonic() - t0, 1),
        },
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(cfg).items()},
    }
    (tmp / REPORT_NAME).write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
    if cfg.out_dir.exists():
        shutil.rmtree(cfg.out_dir)
    tmp.rename(cfg.out_dir)
    return report


def _generate_data(
    cfg: TrainConfig,
    model,
    prompts: list[list[int]],
    aux: tuple[int, ...],
    end_id: Optional[int],
    log: Callable[[str], None],
) -> tuple[list[list[int]], list[tuple[torch.Tensor, torch.Tensor]]]:
    """(sequences, (features, target top-1) labels) of samples_per_prompt answers per prompt."""
    data = []
    for i in range(cfg.samples_per_prompt):
        data += generate_labelled(
            model,
            prompts,
            aux,
            max_new=cfg.answer_tokens,
            end_id=end_id,
            batch=cfg.gen_batch,
            log=log,
            temperature=SAMPLE_TEMPERATURE if i else 0.0,
            seed=cfg.seed + i,
        )
    seqs = [s for s, _, _ in data]
    labelled = [(f, t) for _, f, t in data]
    return seqs, labelled


def _draft_map(
    labelled: list[tuple[torch.Tensor, torch.Tensor]], vocab_size: int, draft_vocab: int
) -> tuple[torch.Tensor, torch.Tensor, float]:
    """(draft vocabulary ids, target -> draft map with -100 outside, share of labels covered)."""
    ids = draft_vocabulary([t for _, t in labelled], vocab_size, draft_vocab)
    to_draft = torch.full((vocab_size,), -100, dtype=torch.long)
    to_draft[ids] = torch.arange(len(ids))
    covered = float((to_draft[torch.cat([t for _, t in labelled])] >= 0).float().mean())
    return ids, to_draft, covered


def _parser() -> argparse.ArgumentParser:
    defaults = {f.name: f.default for f in fields(TrainConfig)}
    ap = argparse.ArgumentParser(description="Train an EAGLE-3 draft head for a target by self-distillation.")
    ap.add_argument("--target", required=True, help="Hugging Face directory of the target")
    ap.add_argument("--output_dir", required=True)
    for name in CLI_OPTIONS:
        d = defaults[name]
        ap.add_argument(f"--{name}", type=type(d), default=d, help=f"default {d}")
    ap.add_argument("-q", "--quiet", action="store_true", help="no progress lines on stderr")
    return ap


def main(argv: list[str] | None = None) -> int:
    a = _parser().parse_args(argv)
    log = None if a.quiet else (lambda msg: print(f"[train-eagle] {msg}", file=sys.stderr, flush=True))
    try:
        report = run(TrainConfig(Path(a.target), Path(a.output_dir), **{k: getattr(a, k) for k in CLI_OPTIONS}), log)
    except TrainError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(
        json.dumps(
            {k: report[k] for k in ("steps", "final_loss", "heldout_agreement_per_step", "params", "bytes", "seconds")}
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
