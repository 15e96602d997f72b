"""Where a speculative request's time goes: the BLS's per-request profile (its `profile` output, sent when the request
sets `return_profile`) and the bench's table of it over many requests (`bench served --profile`).

A request's time splits into the proposal (proposer or draft engine), the target calls by kind and tokens submitted,
the BLS's own Python (parsing and tokenizing, the loop's bookkeeping, streamed chunks, the final response) and, on the
client's side, Triton and gRPC: the client's measured time minus what the BLS accounted for.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Iterable, Optional, Sequence

# target call kinds: the first call (it reads the prompt), a verification of drafts + 1, a run without speculation
PREFILL, VERIFY, DECODE, ENGINE = "prefill", "verify", "decode", "in-engine"

# (key, label) of the parts, in the table's order; they sum to the client's measured request time
PARTS = (
    ("proposal_s", "proposal (proposer / draft engine)"),
    ("target_s", "target calls (BLS → engine → BLS)"),
    ("parse_s", "BLS Python: inputs, tokenization, checks"),
    ("loop_s", "BLS Python: loop bookkeeping (policy, acceptance, engine inputs)"),
    ("stream_s", "BLS Python: streamed chunks (detokenize, send)"),
    ("finish_s", "BLS Python: final response (metrics, detokenize, outputs)"),
    ("triton_s", "Triton / gRPC (client time − BLS time)"),
)


@dataclass
class RequestProfile:
    """One request's seconds, summed over its rounds, as the BLS measured them (triton_s: filled in by the client)."""

    bls_s: float = 0.0  # the BLS's whole request: first look at it to the final response's outputs
    parse_s: float = 0.0
    proposal_s: float = 0.0
    loop_s: float = 0.0
    stream_s: float = 0.0
    finish_s: float = 0.0
    # (kind, tokens) -> [calls, seconds]; verify/prefill: tokens submitted (drafts + 1), decode: tokens it produced
    calls: dict[tuple[str, int], list] = field(default_factory=dict)

    @property
    def target_s(self) -> float:
        return sum(s for _, s in self.calls.values())

    def add_call(self, kind: str, tokens: int, seconds: float) -> None:
        c = self.calls.setdefault((kind, tokens), [0, 0.0])
        c[0] += 1
        c[1] += seconds

    def to_json(self) -> str:
        d = {k: getattr(self, k) for k in ("bls_s", "parse_s", "proposal_s", "loop_s", "stream_s", "finish_s")}
        d["calls"] = [[kind, n, c, s] for (kind, n), (c, s) in sorted(self.calls.items())]
        return json.dumps(d, separators=(",", ":"))

    @staticmethod
    def parse(value) -> dict:
        """The BLS's `profile` output as either protocol returns it (bytes, str, or a one-element list) as a dict."""
        while isinstance(value, (list, tuple)):
            value = value[0]
        return json.loads(value.decode() if isinstance(value, (bytes, bytearray)) else value)

    @staticmethod
    def from_json(value) -> "RequestProfile":
        """A profile from parse()'s dict or the output itself."""
        d = value if isinstance(value, dict) else RequestProfile.parse(value)
        p = RequestProfile(**{k: float(v) for k, v in d.items() if k != "calls"})
        for kind, n, c, s in d.get("calls", []):
            p.calls[(str(kind), int(n))] = [int(c), float(s)]
        return p


def loop_profile(rounds: Sequence, loop_s: float, stream_s: float = 0.0) -> RequestProfile:
    """The loop's part of a request from its speculative_loop.Round list and the wall seconds of the loop (stream_s:
    of them, in emitting chunks). No rounds (in-engine modes): one engine call, the loop's time less the chunks'."""
    p = RequestProfile(stream_s=stream_s)
    if not rounds:
        p.add_call(ENGINE, 0, max(0.0, loop_s - stream_s))
        return p
    for i, r in enumerate(rounds):
        call = r.call_s or r.target_s  # call_s: the call alone, without the engine inputs built before it
        kind = PREFILL if i == 0 else VERIFY if r.drafted else DECODE
        p.add_call(kind, r.drafted + 1 if kind != DECODE else r.tokens, call)
        p.proposal_s += r.draft_s
    p.loop_s = max(0.0, loop_s - p.proposal_s - p.target_s - stream_s)
    return p


def summarize(profiles: Iterable[tuple[RequestProfile, float]]) -> Optional[dict]:
    """The bench's table over (profile, the client's measured seconds) per request; None without any."""
    pairs = list(profiles)
    if not pairs:
        return None
    total = sum(t for _, t in pairs)
    parts = {k: 0.0 for k, _ in PARTS}
    calls: dict[tuple[str, int], list] = {}
    for p, t in pairs:
        for k in ("proposal_s", "target_s", "parse_s", "loop_s", "stream_s", "finish_s"):
            parts[k] += getattr(p, k)
        # what the BLS did not account for: Triton's and gRPC's work, and the BLS handing over its final outputs
        parts["triton_s"] += t - _accounted(p)
        for key, (c, s) in p.calls.items():
            acc = calls.setdefault(key, [0, 0.0])
            acc[0] += c
            acc[1] += s
    order = {PREFILL: 0, VERIFY: 1, DECODE: 2, ENGINE: 3}
    return {
        "requests": len(pairs),
        "request_s": total,
        "parts": [
            {"part": k, "label": label, "seconds": parts[k], "share": parts[k] / total if total else None}
            for k, label in PARTS
        ],
        "calls": [
            {"call": kind, "tokens": n, "count": c, "seconds": s, "mean_s": s / c}
            for (kind, n), (c, s) in sorted(calls.items(), key=lambda kv: (order.get(kv[0][0], 9), kv[0][1]))
        ],
        "note": "target calls: prefill = the first call (it reads the prompt), verify n = n tokens submitted "
        "(drafts + 1), decode n = a run without speculation that produced n tokens; Triton / gRPC = the client's "
        "measured time less what the BLS accounted for",
    }


def _accounted(p: RequestProfile) -> float:
    return p.parse_s + p.proposal_s + p.target_s + p.loop_s + p.stream_s + p.finish_s
