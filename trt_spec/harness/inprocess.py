"""In-process benchmark of the reference engine: baseline (target-only greedy) vs speculative, alternating
per prompt in one run, with a k sweep. No server: this is the engine's own ceiling, which the served
benchmark is compared against.

Reported per k: baseline and speculative tokens/s, speedup (end to end, prefill included), decode speedup
(TPOT ratio: time after the first token, which speculation accelerates), token identity (fraction of prompts whose
tokens are identical), acceptance rate (vLLM: accepted / drafted), mean acceptance length (1 + accepted /
steps), the per-token acceptance α that explains that length under Leviathan et al.'s i.i.d. model
((1 − α^(k+1)) / (1 − α) = mean acceptance length), the draft/target cost ratio c (draft time per drafted
token / target time per baseline token), the Leviathan bound S = (1 − α^(k+1)) / ((1 − α)(k·c + 1)) and
efficiency = speedup / bound. The theorem takes a (k + 1)-token verification pass to cost one decode step; on a
CPU it costs more (measured r, in decode steps, from the same run: target time per verification step / per
baseline step, prefills excluded), so the report adds the bound with r in place of 1 and the efficiency against
it: what separates the implementation's overhead from the hardware's verification cost.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional, Sequence

from ..records.speculation import leviathan_bound, solve_alpha
from .metrics import fmt, low_acceptance_advice
from .prompts import Prompt


@dataclass
class Loaded:
    target: object
    draft: object  # ReferenceModel | NgramDraft | None
    tokenizer: object
    mode: str
    eos: tuple[int, ...]
    max_draft_len: int
    target_dir: str  # the target's engine directory


def load_deployment(build_dir: Path) -> Loaded:
    from transformers import AutoTokenizer

    from ..records.manifest import BuildManifest
    from ..reference.engine import load_engine
    from ..reference.ngram import NgramDraft

    m = BuildManifest.read(build_dir)
    if m.engine != "reference":
        raise ValueError(f"{build_dir}: --in-process runs the CPU reference engine; this build is {m.engine}. "
                         "Benchmark a GPU deployment through Triton with `trt-spec bench --url`")
    mode, k = m.speculative.mode, m.speculative.max_draft_len
    target = load_engine(m.target.dir)
    draft = None
    if mode == "draft_target":
        draft = load_engine(m.draft.dir)
    elif mode == "ngram":
        draft = NgramDraft(max_ngram=m.speculative.ngram_size, k=k)
    tok = AutoTokenizer.from_pretrained(m.target.dir)
    eos = (int(tok.eos_token_id),) if tok.eos_token_id is not None else ()
    return Loaded(target, draft, tok, mode, eos, k, m.target.dir)


def chat_ids(tokenizer, text: str) -> list[int]:
    """The prompt as the model expects it: its chat template when it has one, else plain text."""
    if getattr(tokenizer, "chat_template", None):
        out = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                            tokenize=True)
        return list(out["input_ids"] if isinstance(out, dict) or hasattr(out, "keys") else out)
    return list(tokenizer.encode(text))


def run_inprocess(d: Loaded, prompts: Sequence[Prompt], ks: Sequence[int], *, repeats: int = 1,
                  warmup: bool = True, ignore_eos: bool = False,
                  progress: Optional[Callable[[str], None]] = None) -> dict:
    import torch

    from ..reference.speculative import SpecMetrics, generate

    say = progress or (lambda s: None)
    ids = [chat_ids(d.tokenizer, p.text) for p in prompts]
    if warmup:
        generate(d.target, [ids[0]], 4, eos_token_ids=d.eos)
        if d.draft is not None:
            generate(d.target, [ids[0]], 4, draft=d.draft, k=min(ks), eos_token_ids=d.eos)
    # Time to first token (prefill + one step) per prompt: identical for both, so decode time = total - TTFT.
    ttft = []
    for x in ids:
        t0 = time.perf_counter()
        generate(d.target, [x], 1, eos_token_ids=d.eos)
        ttft.append(time.perf_counter() - t0)
    prefills = sum(ttft) * repeats  # the prefill time in each side's totals, per k
    results = []
    for k in ks:
        if d.draft is not None and k > d.max_draft_len:
            raise ValueError(f"k {k} > max_draft_len {d.max_draft_len} of this build; pick k <= {d.max_draft_len}")
        base_t = spec_t = base_dec = spec_dec = 0.0
        base_n = spec_n = 0
        identical = 0
        spec_metrics, base_metrics = [], []
        samples = []
        for r in range(repeats):
            for i, (p, x) in enumerate(zip(prompts, ids)):
                say(f"k={k} rep {r + 1}/{repeats} prompt {i + 1}/{len(prompts)}")
                runs = {}
                order = ("base", "spec") if (i + r) % 2 == 0 else ("spec", "base")  # alternate: no drift bias
                for which in order:
                    t0 = time.perf_counter()
                    res = generate(d.target, [x], p.max_tokens, draft=d.draft if which == "spec" else None, k=k,
                                   eos_token_ids=d.eos, ignore_eos=ignore_eos)
                    runs[which] = (res, time.perf_counter() - t0)
                (b, bt), (s, st) = runs["base"], runs["spec"]
                base_t, spec_t = base_t + bt, spec_t + st
                base_dec += max(bt - ttft[i], 1e-9)
                spec_dec += max(st - ttft[i], 1e-9)
                base_n, spec_n = base_n + len(b.tokens[0]), spec_n + len(s.tokens[0])
                same = b.tokens[0] == s.tokens[0]
                identical += same
                spec_metrics.append(s.metrics)
                base_metrics.append(b.metrics)
                samples.append({"prompt": p.id or i, "k": k, "repeat": r, "baseline_s": bt, "spec_s": st,
                                "tokens": len(b.tokens[0]), "identical": same,
                                "accepted": s.metrics.accepted, "drafted": s.metrics.drafted,
                                "steps": s.metrics.steps})
        sm, bm = SpecMetrics.merge(spec_metrics), SpecMetrics.merge(base_metrics)
        base_tok_s = base_n / base_t
        spec_tok_s = spec_n / spec_t
        speedup = spec_tok_s / base_tok_s
        decode_speedup = base_dec / spec_dec  # TPOT ratio: the same tokens after the same first token
        mean_len = sm.mean_acceptance_length
        alpha = solve_alpha(mean_len or 1.0, k)
        target_per_token = bm.time_target_s / max(1, bm.new_tokens)
        draft_per_token = sm.time_draft_s / max(1, sm.drafted)
        c = draft_per_token / target_per_token if target_per_token else 0.0
        bound = leviathan_bound(alpha, k, c)
        # r: one verification pass (k + 1 tokens) in baseline decode steps, both without the prefills.
        base_step = (bm.time_target_s - prefills) / max(1, bm.steps)
        verify_cost = (sm.time_target_s - prefills) / max(1, sm.steps) / base_step if base_step > 0 else 1.0
        adjusted = leviathan_bound(alpha, k, c, verify_cost=verify_cost)
        row = {
            "k": k, "baseline_tok_s": base_tok_s, "spec_tok_s": spec_tok_s, "speedup": speedup,
            "decode_speedup": decode_speedup, "prefill_share": prefills / base_t,
            "token_identity": identical / (len(prompts) * repeats),
            "acceptance_rate": sm.acceptance_rate, "mean_acceptance_length": mean_len, "alpha": alpha,
            "cost_ratio": c, "leviathan_bound": bound, "efficiency": speedup / bound if bound else 0.0,
            "verify_cost": verify_cost, "adjusted_bound": adjusted,
            "adjusted_efficiency": speedup / adjusted if adjusted else 0.0,
            "per_position_acceptance": sm.per_position_acceptance, "accepted_histogram": sm.accepted_histogram,
            "drafted": sm.drafted, "accepted": sm.accepted, "steps": sm.steps, "speculative_rounds": sm.speculative_steps,
            "time_draft_s": sm.time_draft_s, "time_target_s": sm.time_target_s,
            "baseline_tokens": base_n, "spec_tokens": spec_n, "samples": samples,
        }
        row["warning"] = low_acceptance_advice(alpha, k, c, speedup)
        results.append(row)
    best = max(results, key=lambda r: r["speedup"])
    return {"mode": d.mode, "prompts": len(prompts), "repeats": repeats, "ignore_eos": ignore_eos,
            "threads": torch.get_num_threads(), "sweep": results, **{k: v for k, v in best.items() if k != "samples"}}


def format_report(rep: dict) -> str:
    lines = [f"in-process benchmark: mode {rep['mode']}, {rep['prompts']} prompts x {rep['repeats']}, "
             f"{rep['threads']} torch threads, greedy"]
    lines.append(f"{'k':>3} {'base tok/s':>10} {'spec tok/s':>10} {'speedup':>8} {'decode':>7} {'identity':>8} {'accept':>7} "
                 f"{'mean len':>8} {'alpha':>6} {'c':>6} {'bound':>6} {'effic.':>6} {'r':>5} {'bound_r':>7} {'eff_r':>5}")
    for r in rep["sweep"]:
        lines.append(f"{r['k']:>3} {r['baseline_tok_s']:>10.1f} {r['spec_tok_s']:>10.1f} {r['speedup']:>7.2f}x "
                     f"{r['decode_speedup']:>6.2f}x "
                     f"{r['token_identity']:>8.0%} {fmt(r['acceptance_rate'], '>7.2f')} {fmt(r['mean_acceptance_length'], '>8.2f')} "
                     f"{r['alpha']:>6.2f} {r['cost_ratio']:>6.3f} {r['leviathan_bound']:>5.2f}x {r['efficiency']:>6.2f} "
                     f"{r['verify_cost']:>5.2f} {r['adjusted_bound']:>6.2f}x {r['adjusted_efficiency']:>5.2f}")
    lines.append(f"best k={rep['k']}: {rep['speedup']:.2f}x end to end ({rep['spec_tok_s']:.1f} vs "
                 f"{rep['baseline_tok_s']:.1f} tok/s), {rep['decode_speedup']:.2f}x in decode (TPOT; prefill is "
                 f"{rep['prefill_share']:.0%} of the baseline's time and identical in both)")
    lines.append("bound = Leviathan et al. (verification costs one decode step); r = measured cost of one "
                 "verification pass in decode steps; bound_r = the bound with that cost; eff_r = speedup / bound_r")
    for r in rep["sweep"]:
        if r.get("warning"):
            lines.append(f"WARNING (k={r['k']}): {r['warning']}")
    if "lean_vs_hf" in rep:
        c = rep["lean_vs_hf"]
        lines.append(f"target-only greedy, {c['prompts']} prompts x {c['max_tokens']} tokens: lean runtime "
                     f"{c['lean_tok_s']:.1f} tok/s vs HF generate {c['hf_tok_s']:.1f} tok/s = {c['ratio']:.2f}x "
                     f"({c['identical_prompts']}/{c['prompts']} prompts token-identical)")
    return "\n".join(lines)


def to_json(rep: dict) -> str:
    return json.dumps(rep, indent=2, default=float)


def compare_hf(d: Loaded, prompts: Sequence[Prompt], *, max_tokens: int = 64) -> dict:
    """Target-only greedy: the lean runtime vs HF transformers `generate` on the same (dequantized) weights and
    prompts, alternating per prompt. Returns tokens/s of both and their ratio."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from ..reference.export import load_engine_state_dict
    from ..reference.speculative import generate

    engine_dir = Path(d.target_dir)
    cfg = AutoConfig.for_model(**{k: v for k, v in json.loads((engine_dir / "config.json").read_text()).items()
                                  if k not in ("quantization_config",)})
    hf = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    hf.load_state_dict(load_engine_state_dict(engine_dir), strict=False)
    hf.eval()
    ids = [chat_ids(d.tokenizer, p.text) for p in prompts]
    lean_t = hf_t = 0.0
    lean_n = hf_n = same = 0
    with torch.inference_mode():
        hf.generate(torch.tensor([ids[0]]), max_new_tokens=2, do_sample=False)  # warm-up
        generate(d.target, [ids[0]], 2)
        for x in ids:
            t0 = time.perf_counter()
            out = hf.generate(torch.tensor([x]), max_new_tokens=max_tokens, min_new_tokens=max_tokens, do_sample=False)
            hf_t += time.perf_counter() - t0
            h = out[0, len(x):].tolist()
            t0 = time.perf_counter()
            lean = generate(d.target, [x], max_tokens, ignore_eos=True).tokens[0]
            lean_t += time.perf_counter() - t0
            hf_n, lean_n = hf_n + len(h), lean_n + len(lean)
            same += h == lean
    return {"hf_tok_s": hf_n / hf_t, "lean_tok_s": lean_n / lean_t, "ratio": (lean_n / lean_t) / (hf_n / hf_t),
            "identical_prompts": same, "prompts": len(ids), "max_tokens": max_tokens}
