"""Micro-benchmark of in-flight batching: total tokens/s of plain greedy generation at several concurrencies.

    python -m trt_spec.reference.bench_batching ENGINE_DIR [--concurrency 1 2 4 8] [--max-new 64]

Levels alternate across rounds and report their median round, so background load affects all alike.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Sequence

from .batching import BatchScheduler
from .engine import ReferenceEngine, Sampling, load_engine
from .model import ReferenceModel

PROMPTS = [
    "Write a Python function that checks whether a string is a palindrome.",
    "Explain the difference between a list and a tuple in Python.",
    "What is the capital of France, and what is it famous for?",
    "Summarize the plot of a detective story in three sentences.",
    "Give three tips for writing readable code.",
    "How does a hash table handle collisions?",
    "Write a haiku about the sea.",
    "What are the main causes of inflation?",
]


@dataclass(frozen=True)
class LevelResult:
    concurrency: int
    new_tokens: int
    wall_s: float
    tokens_per_s: float
    ratio: float  # vs the first level
    iterations: int
    mean_batch: float  # sequences per forward


def prompt_ids(engine_dir: Path, n: int) -> list[list[int]]:
    """n tokenized prompts with distinct first tokens (no prefix sharing)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(engine_dir)
    return [tok.encode(f"Question {i}: {PROMPTS[i % len(PROMPTS)]}\nAnswer:") for i in range(n)]


def bench_concurrency(
    model: ReferenceModel,
    prompts: Sequence[Sequence[int]],
    levels: Sequence[int] = (1, 2, 4, 8),
    max_new: int = 64,
    rounds: int = 3,
    max_seq_len: int = 2048,
) -> list[LevelResult]:
    """Total greedy tokens/s per concurrency level; every request makes max_new tokens."""
    if not levels or min(levels) < 1:
        raise ValueError(f"levels must be >= 1, got {list(levels)}")
    if len(prompts) < max(levels):
        raise ValueError(f"need {max(levels)} prompts, got {len(prompts)}")
    # warm-up: oneDNN creates its primitives per row count once
    with BatchScheduler(ReferenceEngine(model, max_seq_len, prefix_cache_bytes=0), max_batch_size=max(levels)) as sch:
        for h in [sch.submit_generate(p, 4, Sampling()) for p in prompts[: max(levels)]]:
            h.result()
    runs: dict[int, list[tuple[float, int, list]]] = {c: [] for c in levels}
    for _ in range(rounds):
        for c in levels:
            # no prefix cache: every level pays its prefills
            with BatchScheduler(ReferenceEngine(model, max_seq_len, prefix_cache_bytes=0), max_batch_size=c) as sch:
                t0 = time.perf_counter()
                handles = [sch.submit_generate(p, max_new, Sampling()) for p in prompts[:c]]
                n = sum(len(h.result().tokens) for h in handles)
                runs[c].append((time.perf_counter() - t0, n, list(sch.stats)))
    out: list[LevelResult] = []
    for c in levels:
        wall, n, stats = sorted(runs[c], key=lambda r: r[0])[len(runs[c]) // 2]
        tps = n / wall
        out.append(
            LevelResult(
                c,
                n,
                wall,
                tps,
                tps / out[0].tokens_per_s if out else 1.0,
                len(stats),
                sum(s.sequences for s in stats) / max(len(stats), 1),
            )
        )
    return out


def main(argv: Sequence[str] | None = None) -> list[LevelResult]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("engine_dir", type=Path)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 2, 4, 8])
    ap.add_argument("--max-new", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3, help="rounds over all levels; each level reports its median")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    model = load_engine(args.engine_dir)
    results = bench_concurrency(
        model, prompt_ids(args.engine_dir, max(args.concurrency)), args.concurrency, args.max_new, args.rounds
    )
    if args.json:
        print(json.dumps([asdict(r) for r in results], indent=2))
    else:
        print(f"{'in flight':>9} {'tokens':>7} {'wall s':>7} {'tok/s':>7} {'ratio':>6} {'mean batch':>10}")
        for r in results:
            print(
                f"{r.concurrency:>9} {r.new_tokens:>7} {r.wall_s:>7.2f} {r.tokens_per_s:>7.1f} {r.ratio:>5.2f}x "
                f"{r.mean_batch:>10.2f}"
            )
    return results


if __name__ == "__main__":
    main()
