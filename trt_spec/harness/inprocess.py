"""In-process benchmark of a CPU deployment: the BLS's SpeculativeLoop over stand-in engines loaded from the
repository's own configs, no server; the served path's ceiling, and where the draft/target cost ratio c is measured.

Baseline and speculative runs alternate per prompt over a k sweep. Per k: tokens/s, paired speedup, decode speedup,
token identity, the served bench's acceptance summary, α, c, the Leviathan bound and efficiency, plus the bound with
r (a verification's measured cost in decode steps) in place of 1.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, NamedTuple, Optional, Sequence

import numpy as np

from ..in_triton.local_engines import LocalEngines
from ..in_triton.speculative_loop import (
    RequestError,
    SpecRequest,
    SpeculativeLoop,
    engine_inputs,
    response_tokens,
    validate,
)
from ..records import backend_contract as bc
from ..records import defaults
from ..records.bls_parameters import BlsParameters
from ..records.names import BASELINE, BLS, ENGINE_MODELS, ENSEMBLE, SPECULATIVE
from ..records.profile import loop_profile
from ..records.profile import summarize as profile_table
from ..records.speculation import acceptance_summary, leviathan_bound, paired_speedup, solve_alpha
from .bench import RequestSample, per_category, request_acceptance_counts
from .metrics import fmt, low_acceptance_advice, tpot
from .prompts import NEEDS_TEMPLATE, Prompt, conversation
from .report import profile_table as profile_lines

NS = 1e-9


@dataclass
class Loaded:
    engines: LocalEngines
    bls: BlsParameters
    baseline_model: str  # the engine model the ensemble calls
    default_k: int
    tokenizer: object
    end_id: int
    pad_id: int
    target_dir: str

    @property
    def mode(self) -> str:
        return self.bls.speculative_mode

    @property
    def max_draft_len(self) -> int:
        return self.bls.max_draft_len

    def close(self) -> None:
        self.engines.close()


def load_deployment(build_dir: Path) -> Loaded:
    """The deployment `trt-spec repo` would write, loaded in process (non-decoupled: the engine calls are unary)."""
    from google.protobuf import json_format
    from transformers import AutoTokenizer

    from ..in_triton.serving import default_end_id, default_pad_id
    from ..records.manifest import BuildManifest
    from ..reference.standin import StandIn, model_parameters
    from ..repository.writer import RepoOptions, repository_configs

    m = BuildManifest.read(build_dir)
    if m.engine != "reference":
        raise ValueError(
            f"{build_dir}: bench in-process runs the CPU reference engine; this build is {m.engine}. "
            "Benchmark a GPU deployment through Triton with `trt-spec bench served --url`"
        )
    configs = {
        name: json_format.MessageToDict(cfg, preserving_proto_field_name=True)
        for name, cfg in repository_configs(m.deployment, m.engines, RepoOptions(decoupled=False)).items()
    }
    standins = {}
    try:
        for name in ENGINE_MODELS:
            if name in configs:
                standins[name] = StandIn.load(configs[name], name)
    except Exception:
        for s in standins.values():
            s.close()
        raise
    bls = BlsParameters.from_parameters(model_parameters(configs[BLS]))
    baseline = next(
        s["model_name"] for s in configs[ENSEMBLE]["ensemble_scheduling"]["step"] if s["model_name"] in ENGINE_MODELS
    )
    tok = AutoTokenizer.from_pretrained(m.target.dir)
    return Loaded(
        LocalEngines(standins),
        bls,
        baseline,
        bls.num_draft_tokens,
        tok,
        default_end_id(tok),
        default_pad_id(tok),
        m.target.dir,
    )


def chat_ids(tokenizer, text: str) -> list[int]:
    """The prompt as the model expects it: its chat template when it has one, else plain text."""
    if getattr(tokenizer, "chat_template", None):
        return conversation_ids(tokenizer, [{"role": "user", "content": text}])
    return list(tokenizer.encode(text))


def conversation_ids(tokenizer, messages: list[dict]) -> list[int]:
    """A conversation's tokens in the model's chat template, the assistant's turn opened."""
    out = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    return list(out[bc.INPUT_IDS] if isinstance(out, dict) or hasattr(out, "keys") else out)


@dataclass(frozen=True)
class BaselineRun:
    tokens: list[int]
    wall_s: float
    decode_s: float  # after the first token


@dataclass(frozen=True)
class SpecRun:
    tokens: list[int]
    wall_s: float
    decode_s: float  # after the first emitted chunk
    metrics: object  # speculative_loop.LoopStats


class Pair(NamedTuple):
    """One prompt and repeat of a row, on both sides."""

    prompt: str | int  # id, else index
    repeat: int
    base: BaselineRun
    spec: SpecRun
    category: str
    index: int
    turn: int = 1


async def baseline_call(d: Loaded, prompt: list[int], max_tokens: int, end_id: int) -> BaselineRun:
    """The ensemble's engine call: the target alone, greedy, with its perf outputs."""
    r = SpecRequest(prompt, max_tokens, 0, end_id, d.pad_id)
    ins = engine_inputs(r, prompt, max_tokens, 0)
    ins[bc.RETURN_PERF_METRICS] = np.asarray([[True]], dtype=bool)
    t0 = time.perf_counter()
    (out,) = await d.engines(d.baseline_model, ins, [*bc.MANDATORY_OUTPUTS, *bc.PERF_OUTPUTS])
    wall = time.perf_counter() - t0
    first, last = (int(np.asarray(out[n]).reshape(-1)[0]) for n in ("first_token_time_ns", "last_token_time_ns"))
    return BaselineRun(response_tokens(out), wall, (last - first) * NS)


async def speculative_call(
    d: Loaded,
    loop: SpeculativeLoop,
    prompt: list[int],
    max_tokens: int,
    k: int,
    end_id: int,
    policy: Optional[str],
    tenant: Optional[str] = None,
) -> SpecRun:
    """One request through the served loop, as the BLS runs it for a greedy client (as `tenant`)."""
    first: list[float] = []
    r = SpecRequest(prompt, max_tokens, k, end_id, d.pad_id, draft_len_policy=policy, tenant=tenant)
    t0 = time.perf_counter()
    tokens, m = await loop.generate(r, lambda new: first or first.append(time.perf_counter()))
    t1 = time.perf_counter()
    return SpecRun(tokens, t1 - t0, t1 - (first[0] if first else t1), m)


def run_inprocess(
    d: Loaded,
    prompts: Sequence[Prompt],
    ks: Sequence[int],
    *,
    repeats: int = 1,
    policies: Sequence[Optional[str]] = (None,),
    warmup: bool = True,
    ignore_eos: bool = False,
    progress: Optional[Callable[[str], None]] = None,
    turns: str = defaults.TURNS,
    profile: bool = False,
) -> dict:
    """Paired baseline/speculative runs per (policy, k), alternating per prompt. policy None: the deployment's.
    turns "all": one pair per conversation turn, each side fed its own answers. profile: each row says where its
    speculative requests' time went (the served bench's --profile table, without Triton)."""
    import torch

    say = progress or (lambda s: None)
    if turns == "all" and not getattr(d.tokenizer, "chat_template", None):
        raise ValueError(NEEDS_TEMPLATE.format(why=f"the target's tokenizer ({d.target_dir}) has none"))
    ids = [chat_ids(d.tokenizer, p.text) for p in prompts]
    end_id = -1 if ignore_eos else d.end_id  # -1: never stop on EOS
    for policy in policies:
        for k in ks:
            for p, x in zip(prompts, ids):  # the BLS's request checks, before any work
                validate(d.bls, len(x), p.max_tokens, k, False, policy)
                if turns == "all" and len(p.turns) > 1:  # the last turn, even with empty answers before it
                    last = conversation_ids(d.tokenizer, conversation(p.turns, [""] * (len(p.turns) - 1)))
                    _validate_turn(d, p, len(p.turns), last, k, policy)

    async def run() -> list[dict]:
        rows = []
        for policy in policies:
            for k in ks:
                loop = SpeculativeLoop(d.bls, d.engines)  # fresh policy state per row, warmed like a server
                if warmup:
                    await baseline_call(d, ids[0], 4, end_id)
                    await speculative_call(d, loop, ids[0], min(8, prompts[0].max_tokens), k, end_id, policy)
                pairs = []
                for r in range(repeats):
                    for i, (p, x) in enumerate(zip(prompts, ids)):
                        say(
                            f"k={k}{' ' + policy if policy else ''} rep {r + 1}/{repeats} prompt {i + 1}/{len(prompts)}"
                        )
                        pair_up = _conversation_pairs if turns == "all" else _prompt_pair
                        pairs += await pair_up(d, loop, p, x, i, r, k, end_id, policy)
                rows.append(_row(k, policy or d.bls.draft_len_policy, pairs, profile))
        return rows

    results = asyncio.run(run())
    best = max(results, key=lambda row: row["speedup"])
    return {
        "mode": d.mode,
        "prompts": len(prompts),
        "repeats": repeats,
        "turns": turns,
        "ignore_eos": ignore_eos,
        "threads": torch.get_num_threads(),
        "sweep": results,
        **{key: v for key, v in best.items() if key != "samples"},
    }


async def _prompt_pair(d: Loaded, loop, p: Prompt, x: list[int], i: int, r: int, k, end_id, policy) -> list[Pair]:
    """Prompt i on both sides; which goes first alternates (no drift bias)."""
    runs = {}
    for which in ("base", "spec") if (i + r) % 2 == 0 else ("spec", "base"):
        runs[which] = (
            await baseline_call(d, x, p.max_tokens, end_id)
            if which == "base"
            else await speculative_call(d, loop, x, p.max_tokens, k, end_id, policy)
        )
    return [Pair(p.id or i, r, runs["base"], runs["spec"], p.category, i)]


async def _conversation_pairs(d: Loaded, loop, p: Prompt, x: list[int], i: int, r: int, k, end_id, policy) -> list:
    """A Pair per turn of prompt i's conversation, each side fed its own answers (x: turn 1's ids), the speculative
    side under one tenant per conversation and repeat (the row's loop is new: no other row's cache)."""
    answers: dict[str, list[str]] = {"base": [], "spec": []}
    pairs = []
    for t in range(1, len(p.turns) + 1):
        runs = {}
        for which in ("base", "spec") if (i + r + t - 1) % 2 == 0 else ("spec", "base"):
            ids = x if t == 1 else conversation_ids(d.tokenizer, conversation(p.turns, answers[which]))
            _validate_turn(d, p, t, ids, k, policy)
            runs[which] = (
                await baseline_call(d, ids, p.max_tokens, end_id)
                if which == "base"
                else await speculative_call(d, loop, ids, p.max_tokens, k, end_id, policy, f"conversation/{i}/{r}")
            )
            answers[which].append(d.tokenizer.decode(runs[which].tokens, skip_special_tokens=True))
        pairs.append(Pair(p.id or i, r, runs["base"], runs["spec"], p.category, i, t))
    return pairs


def _validate_turn(d: Loaded, p: Prompt, t: int, ids: list[int], k: int, policy: Optional[str]) -> None:
    """The BLS's request checks for turn t of p's conversation; RequestError."""
    try:
        validate(d.bls, len(ids), p.max_tokens, k, False, policy)
    except RequestError as e:
        raise RequestError(
            f"question {p.id or '?'} turn {t}: {e}; a conversation grows by each answer: lower --max-tokens, or "
            "--turns first"
        ) from None


def _row(k: int, policy: str, pairs: list[Pair], profile: bool = False) -> dict:
    """One (policy, k): the paired runs summed, the acceptance, and the model; profile: where the time went."""
    base = [x.base for x in pairs]
    spec = [x.spec for x in pairs]
    base_t, spec_t = sum(b.wall_s for b in base), sum(s.wall_s for s in spec)
    base_n, spec_n = sum(len(b.tokens) for b in base), sum(len(s.tokens) for s in spec)
    base_dec, spec_dec = sum(b.decode_s for b in base), sum(s.decode_s for s in spec)
    samples = _request_samples(pairs)
    acc = acceptance_summary(request_acceptance_counts([x for x in samples if x.model == SPECULATIVE]))
    rounds = [rd for s in spec for rd in s.metrics.rounds]
    verifications = [rd for rd in rounds if rd.drafted]
    draft_s = sum(rd.draft_s for rd in rounds)
    drafted = sum(rd.drafted for rd in rounds)
    base_step = base_dec / max(1, sum(max(0, len(b.tokens) - 1) for b in base))
    c = (draft_s / drafted) / base_step if drafted and base_step > 0 else 0.0
    verify_cost = (
        sum(rd.target_s for rd in verifications) / len(verifications) / base_step
        if verifications and base_step > 0
        else 1.0
    )
    mean_len = acc["mean_acceptance_length"]
    alpha = solve_alpha(mean_len or 1.0, k)
    speedup, lo, hi = paired_speedup([b.wall_s for b in base], [s.wall_s for s in spec])  # the served bench's
    bound = leviathan_bound(alpha, k, c)
    adjusted = leviathan_bound(alpha, k, c, verify_cost=verify_cost)
    row = {
        "k": k,
        "draft_len_policy": policy,
        "baseline_tok_s": base_n / base_t,
        "spec_tok_s": spec_n / spec_t,
        "speedup": speedup,
        "speedup_ci95": [lo, hi],
        "decode_speedup": base_dec / spec_dec if spec_dec > 0 else float("nan"),
        "ttft_share": (base_t - base_dec) / base_t,
        "token_identity": sum(b.tokens == s.tokens for b, s in zip(base, spec)) / len(pairs),
        "acceptance_rate": acc["acceptance_rate"],
        "mean_acceptance_length": mean_len,
        "alpha": alpha,
        "cost_ratio": c,
        "leviathan_bound": bound,
        "efficiency": speedup / bound if bound else 0.0,
        "verify_cost": verify_cost,
        "adjusted_bound": adjusted,
        "adjusted_efficiency": speedup / adjusted if adjusted else 0.0,
        "per_position_acceptance": acc["per_position_acceptance"],
        "accepted_histogram": acc["histogram"],
        "drafted": acc["drafted"],
        "accepted": acc["accepted"],
        "steps": acc["steps"],
        "speculative_rounds": acc["speculative_rounds"],
        "acceptance": acc,
        "categories": per_category(samples),
        "time_draft_s": draft_s,
        "time_target_s": sum(rd.target_s for rd in rounds),
        "baseline_tokens": base_n,
        "spec_tokens": spec_n,
        "samples": _pair_records(k, pairs),
    }
    if profile:  # the loop's own rounds on the served table's parts: no parsing, streaming or Triton here
        row["profile"] = profile_table((loop_profile(s.metrics.rounds, s.wall_s), s.wall_s) for s in spec)
    row["warning"] = low_acceptance_advice(alpha, k, c, speedup)
    return row


def _request_samples(pairs: list[Pair]) -> list[RequestSample]:
    """Both runs of every pair as the served bench records a request."""

    def sample(model: str, x: Pair, run, *counts) -> RequestSample:
        ttft = run.wall_s - run.decode_s
        n = len(run.tokens)
        args = (model, x.index, x.repeat, n, ttft, run.wall_s, tpot(run.wall_s, ttft, n), *counts)
        cache = run.metrics.cache_accepted if model == SPECULATIVE else None
        return RequestSample(*args, category=x.category, turn=x.turn, cache_accepted=cache)

    out = []
    for x in pairs:
        m = x.spec.metrics
        out += [
            sample(BASELINE, x, x.base),
            sample(SPECULATIVE, x, x.spec, m.accepted, m.drafted, m.steps, list(m.hist), m.draft_lengths),
        ]
    return out


def _pair_records(k: int, pairs: list[Pair]) -> list[dict]:
    """Every pair of a row: both wall times, identity and the speculative run's counts."""
    return [
        {
            "prompt": x.prompt,
            "category": x.category,
            "turn": x.turn,
            "k": k,
            "repeat": x.repeat,
            "baseline_s": x.base.wall_s,
            "spec_s": x.spec.wall_s,
            "tokens": len(x.base.tokens),
            "identical": x.base.tokens == x.spec.tokens,
            "accepted": x.spec.metrics.accepted,
            "drafted": x.spec.metrics.drafted,
            "steps": x.spec.metrics.steps,
            "draft_lengths": x.spec.metrics.draft_lengths,
            "cache_accepted": x.spec.metrics.cache_accepted,
        }
        for x in pairs
    ]


def format_report(rep: dict) -> str:
    lines = [
        f"in-process benchmark (the served loop, no server): mode {rep['mode']}, {rep['prompts']} prompts x "
        f"{rep['repeats']}{_turns_note(rep)}, {rep['threads']} torch threads, greedy"
    ]
    lines.append(
        f"{'k':>3} {'policy':>8} {'base tok/s':>10} {'spec tok/s':>10} {'speedup':>8} {'95% CI':>11} "
        f"{'decode':>7} "
        f"{'identity':>8} {'accept':>7} {'mean len':>8} {'alpha':>6} {'c':>6} {'bound':>6} {'effic.':>6} "
        f"{'r':>5} {'bound_r':>7} {'eff_r':>5}"
    )
    for r in rep["sweep"]:
        lines.append(
            f"{r['k']:>3} {r['draft_len_policy']:>8} {r['baseline_tok_s']:>10.1f} {r['spec_tok_s']:>10.1f} "
            f"{r['speedup']:>7.2f}x {_interval(r['speedup_ci95']):>11} {r['decode_speedup']:>6.2f}x "
            f"{r['token_identity']:>8.0%} {fmt(r['acceptance_rate'], '>7.2f')} "
            f"{fmt(r['mean_acceptance_length'], '>8.2f')} "
            f"{r['alpha']:>6.2f} {r['cost_ratio']:>6.3f} {r['leviathan_bound']:>5.2f}x {r['efficiency']:>6.2f} "
            f"{r['verify_cost']:>5.2f} {r['adjusted_bound']:>6.2f}x {r['adjusted_efficiency']:>5.2f}"
        )
    lines.append("draft lengths chosen per round (k: rounds; 0 = a round without speculation):")
    for r in rep["sweep"]:
        a = r["acceptance"]
        counts = ", ".join(f"{i}: {n}" for i, n in enumerate(a["draft_length_counts"]) if n)
        lines.append(
            f"  k={r['k']} {r['draft_len_policy']}: {counts or 'none'}; mean k when speculating "
            f"{a['mean_draft_length']:.2f}, rounds without speculation "
            f"{a['rounds_without_speculation_share']:.0%}"
        )
    lines += _category_lines(rep)
    for r in rep["sweep"]:
        if r.get("profile"):
            lines += [f"k={r['k']} {r['draft_len_policy']}:", *profile_lines(r["profile"])]
    lines.append(
        f"best k={rep['k']} ({rep['draft_len_policy']}): {rep['speedup']:.2f}x end to end "
        f"(95% CI {_interval(rep['speedup_ci95'])}; {rep['spec_tok_s']:.1f} vs {rep['baseline_tok_s']:.1f} "
        f"tok/s), {rep['decode_speedup']:.2f}x in decode (after the first token; the first token is "
        f"{rep['ttft_share']:.0%} of the baseline's time)"
    )
    lines.append(
        "speedup = Σ baseline / Σ speculative seconds over the paired prompts, as the served bench reports "
        "it (95% CI: paired bootstrap); decode = the same ratio after the first token"
    )
    lines.append(
        "bound = Leviathan et al. at the cap k (verification costs one decode step); r = measured cost of one "
        "verification in decode steps; bound_r = the bound with that cost; eff_r = speedup / bound_r"
    )
    for r in rep["sweep"]:
        if r.get("warning"):
            lines.append(f"WARNING (k={r['k']} {r['draft_len_policy']}): {r['warning']}")
    if "lean_vs_hf" in rep:
        c = rep["lean_vs_hf"]
        lines.append(
            f"target-only greedy, {c['prompts']} prompts x {c['max_tokens']} tokens: lean runtime "
            f"{c['lean_tok_s']:.1f} tok/s vs HF generate {c['hf_tok_s']:.1f} tok/s = {c['ratio']:.2f}x "
            f"({c['identical_prompts']}/{c['prompts']} prompts token-identical)"
        )
    return "\n".join(lines)


def _category_lines(rep: dict) -> list[str]:
    """bench.per_category's rows per (policy, k) with more than one category."""
    lines = []
    for r in rep["sweep"]:
        if not r.get("categories"):
            continue
        lines.append(f"per category, k={r['k']} {r['draft_len_policy']}:")
        turns = any(c.get("turns", c["prompts"]) != c["prompts"] for c in r["categories"])  # --turns all
        lines.append(
            f"  {'category':<16} {'prompts':>7}{' turns' if turns else ''} {'speedup':>8} {'95% CI':>11} "
            f"{'mean len':>8} {'accept':>7} {'no spec':>7}"
        )
        for c in r["categories"]:
            lines.append(
                f"  {c['category']:<16} {c['prompts']:>7}" + (f" {c['turns']:>5}" if turns else "") + " "
                f"{c['speedup']:>7.2f}x {_interval(c['speedup_ci95']):>11} "
                f"{fmt(c['mean_acceptance_length'], '>8.2f')} {fmt(c['acceptance_rate'], '>7.2f')} "
                f"{fmt(c['rounds_without_speculation_share'], '>7.0%')}"
            )
    return lines


def _turns_note(rep: dict) -> str:
    """--turns all: how many turns the conversations had (identity is then per turn)."""
    if rep.get("turns") != "all":
        return ""
    n = len(rep["sweep"][0]["samples"]) // max(1, rep["repeats"]) if rep["sweep"] else 0
    return f", every turn ({n} turns; identity per turn, each side fed its own answers)"


def _interval(ci: Sequence[float]) -> str:
    return f"{ci[0]:.2f}–{ci[1]:.2f}"


def to_json(rep: dict) -> str:
    return json.dumps(rep, indent=2, default=float)


def compare_hf(d: Loaded, prompts: Sequence[Prompt], *, max_tokens: int = 64) -> dict:
    """Target-only greedy: the engine call vs HF `generate` on the same weights and prompts; tokens/s of both and
    their ratio."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from ..reference.export import load_engine_state_dict

    engine_dir = Path(d.target_dir)
    cfg = AutoConfig.for_model(
        **{
            k: v
            for k, v in json.loads((engine_dir / "config.json").read_text()).items()
            if k not in ("quantization_config",)
        }
    )
    hf = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    hf.load_state_dict(load_engine_state_dict(engine_dir), strict=False)
    hf.eval()
    ids = [chat_ids(d.tokenizer, p.text) for p in prompts]

    async def run() -> dict:
        lean_t = hf_t = 0.0
        lean_n = hf_n = same = 0
        with torch.inference_mode():
            hf.generate(torch.tensor([ids[0]]), max_new_tokens=2, do_sample=False)  # warm-up
            await baseline_call(d, ids[0], 2, -1)
            for x in ids:
                t0 = time.perf_counter()
                out = hf.generate(
                    torch.tensor([x]), max_new_tokens=max_tokens, min_new_tokens=max_tokens, do_sample=False
                )
                hf_t += time.perf_counter() - t0
                h = out[0, len(x) :].tolist()
                lean = await baseline_call(d, x, max_tokens, -1)
                lean_t += lean.wall_s
                hf_n, lean_n = hf_n + len(h), lean_n + len(lean.tokens)
                same += h == lean.tokens
        return {
            "hf_tok_s": hf_n / hf_t,
            "lean_tok_s": lean_n / lean_t,
            "ratio": (lean_n / lean_t) / (hf_n / hf_t),
            "identical_prompts": same,
            "prompts": len(ids),
            "max_tokens": max_tokens,
        }

    return asyncio.run(run())
