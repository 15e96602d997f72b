"""Spec-Bench per category, in one run: trt-spec's served CPU deployments against Hugging Face `generate`'s own.

Methods (--methods picks a subset), each measured against its own non-speculative baseline, paired and alternating
per request after a one-request warm-up, greedy, the target's chat template applied, the same prompts and token budget:

- ngram, draft, eagle: the served deployment of build_configs/cpu-smollm2-{ngram,draft,eagle}.yaml on a real
  tritonserver, measured by `trt-spec bench served`'s own paired A/B (harness.bench.paired_ab: `ensemble` vs
  `tensorrt_llm_bls`, streamed); the server and repository come from compare_modes.served.
- hf-prompt-lookup: transformers `generate` on the build's imported target checkpoint (plan.sources["target"] of the
  n-gram config), plain greedy vs `prompt_lookup_num_tokens` = that config's max_draft_len (HF's other defaults).
- hf-assisted: the same, with `assistant_model` = the distilled draft the draft config's build writes
  (plan.sources["draft"]) and `num_assistant_tokens` = its max_draft_len (HF's schedule and confidence threshold).

Prompts: Spec-Bench's question.jsonl (first turns; harness.prompts reads it), MT-Bench's eight categories grouped as
Spec-Bench's leaderboard groups them ("mt_bench"). Rows whose templated prompt does not fit the deployments' limits
(max_input_len; + max tokens <= max_seq_len) are left out, then --limit-per-category questions per category are picked
by --seed, one from each of that many equal slices of the category's rows in file order (spread over the file, never
hand-picked; the same seed picks the same questions whatever --methods is), and sent category by category in turn.

Speedup: records.speculation.paired_speedup (Σ baseline s / Σ speculative s, paired bootstrap 95% interval) per
category and overall, via harness.bench.summarize for every method (HF requests become bench.RequestSample too).
Mean accepted tokens: acceptance_summary's mean acceptance length (1 + accepted / rounds that verified drafts); for HF
counted from the target's forward calls (a pre-hook reads each call's start position and length: drafts = length - 1,
accepted = how far the next call starts beyond the drafts).

    python benchmarks/spec_bench.py [--limit-per-category 3] [--max-tokens 128] [--categories qa rag]
        [--methods ngram hf-prompt-lookup] [--seed 0] [--out build/spec_bench] [--build]

Writes spec_bench.md (leaderboard table + goal checks), spec_bench.json (every request too) and spec_bench.png, and
prints the table and the goal checks. Ratios are only meaningful from one run on a quiet machine.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import sys
import time
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Optional, Sequence

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from compare_modes import build_and_repo, served  # noqa: E402

from trt_spec.harness.prompts import DEFAULT_MAX_TOKENS, Prompt  # noqa: E402

SPEC_BENCH_ENV = "TRT_SPEC_SPEC_BENCH"
SPEC_BENCH_DEFAULT = ROOT.parent / "shared" / "datasets" / "spec_bench" / "question.jsonl"
MT_BENCH = ("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities")
# Spec-Bench's leaderboard columns, in its order (MT-Bench's eight categories are one column)
COLUMNS = {
    "mt_bench": "Multi-turn Conversation",
    "translation": "Translation",
    "summarization": "Summarization",
    "qa": "Question Answering",
    "math_reasoning": "Mathematical Reasoning",
    "rag": "Retrieval-aug. Generation",
}
OVERALL = "overall"


@dataclass(frozen=True)
class Method:
    label: str
    config: str
    served: bool


METHODS = {
    "ngram": Method("trt-spec n-gram (suffix)", "build_configs/cpu-smollm2-ngram.yaml", True),
    "draft": Method("trt-spec draft model", "build_configs/cpu-smollm2-draft.yaml", True),
    "eagle": Method("trt-spec EAGLE", "build_configs/cpu-smollm2-eagle.yaml", True),
    "hf-prompt-lookup": Method("HF prompt lookup", "build_configs/cpu-smollm2-ngram.yaml", False),
    "hf-assisted": Method("HF assisted (distilled draft)", "build_configs/cpu-smollm2-draft.yaml", False),
}
# The goals of issue 32 (point estimates of one run)
FLOOR = 0.97  # every category, every served mode
DRAFT_FREE, PEER = "ngram", "hf-prompt-lookup"
DRAFT_FREE_MIN = 1.3  # draft-free, mean over categories
OVER_PEER = 1.2  # draft-free / HF prompt lookup, means over categories


def log(msg: str) -> None:
    print(f"[spec-bench] {msg}", file=sys.stderr, flush=True)


# --- prompts ---------------------------------------------------------------------------------------------------------


def leaderboard_category(category: str) -> str:
    return "mt_bench" if category in MT_BENCH else category


def fitting(prompts: Sequence[Prompt], tokenizer, max_input_len: int, max_seq_len: int) -> tuple[list, list]:
    """(prompts whose chat-templated tokens fit max_input_len and, with their max_tokens, max_seq_len; the ids of the
    others): what every deployment can serve, checked before anything runs."""
    from trt_spec.harness.prompts import with_chat_template
    from trt_spec.in_triton.serving import encode

    keep, left_out = [], []
    for p, t in zip(prompts, with_chat_template(list(prompts), tokenizer)):
        n = len(encode(tokenizer, t.text))
        (keep if n <= max_input_len and n + p.max_tokens <= max_seq_len else left_out).append(p)
    return keep, [p.id for p in left_out]


def select_per_category(prompts: Sequence[Prompt], limit: int, seed: int, categories: Sequence[str] = ()) -> list:
    """`limit` prompts of each category (all when it has fewer): one from each of `limit` equal slices of the
    category's prompts in file order, the slice's pick drawn by a generator seeded with (seed, category); returned
    round-robin over the categories (in `categories` order, else file order) so that a drifting machine skews none."""
    if limit < 1:
        raise ValueError(f"--limit-per-category must be >= 1, got {limit}")
    by_cat: dict[str, list[Prompt]] = {}
    for p in prompts:
        by_cat.setdefault(p.category, []).append(p)
    unknown = [c for c in categories if c not in by_cat]
    if unknown:
        raise ValueError(f"--categories {', '.join(unknown)}: not in these prompts; they have: {', '.join(by_cat)}")
    picked = []
    for c in categories or list(by_cat):
        rows, rng = by_cat[c], random.Random(f"{seed}/{c}")
        n = len(rows)
        picked.append(
            rows if n <= limit else [rows[rng.randrange(j * n // limit, (j + 1) * n // limit)] for j in range(limit)]
        )
    return [lst[i] for i in range(max(map(len, picked), default=0)) for lst in picked if i < len(lst)]


def spec_bench_prompts(path: Path, max_tokens: int) -> list[Prompt]:
    """Spec-Bench's first turns, each tagged with its leaderboard category (the original kept in the id)."""
    from trt_spec.harness.prompts import load_prompts

    if not path.is_file():
        raise ValueError(
            f"Spec-Bench's question.jsonl is not at {path}: get it from github.com/hemingkx/Spec-Bench "
            f"(data/spec_bench/question.jsonl) and pass --spec-bench PATH or set {SPEC_BENCH_ENV}"
        )
    return [
        replace(
            p,
            max_tokens=max_tokens,
            id=f"{p.id}:{p.category}",
            category=leaderboard_category(p.category),
            follow_ups=(),
        )
        for p in load_prompts(str(path))
    ]


# --- Hugging Face generate -------------------------------------------------------------------------------------------


def hf_sources(config: Path) -> dict[str, str]:
    """role (target, draft) -> the HF directory a config's build reads: what its import-target / distill-draft steps
    write (builder.plan._source_steps), else the configured checkpoint directory."""
    from trt_spec.builder.pipeline import plan_for
    from trt_spec.records.config import load_config

    cfg = load_config(config)
    plan = plan_for(cfg, config)
    out = {"target": cfg.target.checkpoint, **({"draft": cfg.draft.checkpoint} if cfg.draft else {}), **plan.sources}
    out.update({s.name.split("-", 1)[1]: s.output for s in plan.steps if s.name in ("import-target", "distill-draft")})
    return {role: d for role, d in out.items() if d}


class ForwardRounds:
    """A forward pre-hook on the HF target: each call's start position and input length, so that a finished
    generation can be read as rounds (drafts verified, drafts accepted), as the served loop counts them."""

    def __init__(self, model):
        self.calls: list[tuple[int, int]] = []
        self.handle = model.register_forward_pre_hook(self._pre, with_kwargs=True)

    def _pre(self, module, args, kwargs):
        ids, pos = kwargs["input_ids"], kwargs.get("position_ids")
        cache = kwargs.get("cache", kwargs.get("past_key_values"))
        start = int(pos[0, 0]) if pos is not None else (cache.get_seq_length() if cache is not None else 0)
        self.calls.append((start, int(ids.shape[1])))

    def rounds(self, prompt_len: int, final_len: int) -> list[tuple[int, int]]:
        """(drafted, accepted) per target call: the first call's drafts are what it reads past the prompt; a call's
        accepted = where the next call starts - this call's start - its non-draft tokens (the final length - 1 for the
        last call), clamped to [0, drafted] (a stop or the token budget cuts the last round)."""
        out = []
        for i, (start, n) in enumerate(self.calls):
            drafted = n - prompt_len if start == 0 else n - 1
            nxt = self.calls[i + 1][0] if i + 1 < len(self.calls) else final_len - 1
            out.append((drafted, min(max(nxt - start - (n - drafted), 0), drafted)))
        return out


def _hf_request(model, tok, rounds: ForwardRounds, p: Prompt, ids: list[int], extra: dict):
    """One HF generate: (new token ids, ttft_s, latency_s, rounds); the first token's time from a streamer."""
    import torch
    from transformers.generation.streamers import BaseStreamer

    from trt_spec.in_triton.serving import default_end_id, default_pad_id

    class FirstToken(BaseStreamer):
        puts, at = 0, None

        def put(self, value):
            self.puts += 1
            if self.puts == 2:  # the first put is the prompt
                self.at = time.perf_counter()

        def end(self):
            pass

    s = FirstToken()
    rounds.calls.clear()
    t0 = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(
            torch.tensor([ids]),
            max_new_tokens=p.max_tokens,
            do_sample=False,
            eos_token_id=default_end_id(tok),
            pad_token_id=default_pad_id(tok),
            streamer=s,
            **extra,
        )
    latency = time.perf_counter() - t0
    new = out[0, len(ids) :].tolist()
    return new, (s.at or t0 + latency) - t0, latency, rounds.rounds(len(ids), out.shape[1])


def _hf_sample(model_name: str, i: int, p: Prompt, new, ttft, latency, rounds, spec: bool, turn=1, answer=None):
    import hashlib

    from trt_spec.harness.bench import RequestSample
    from trt_spec.harness.metrics import tpot

    s = RequestSample(
        model_name, i, 0, len(new), ttft, latency, tpot(latency, ttft, len(new)), category=p.category, turn=turn
    )
    s.steps = len(rounds)  # target forward calls, the prefill's included
    if answer is not None:  # bench.RequestSample.of's digest: identity per turn
        s.answer_digest = hashlib.sha1(answer.encode()).hexdigest()[:16]
    if spec:
        width = max((d for d, _ in rounds), default=0) + 1
        s.drafted, s.accepted = sum(d for d, _ in rounds), sum(a for _, a in rounds)
        s.histogram = [sum(1 for d, a in rounds if d and a == j) for j in range(width)]
        s.draft_lengths = [d for d, _ in rounds]
        s.acceptance_source = "HF generate: the target's forward calls (ForwardRounds)"
    return s


def run_hf(method: str, prompts: Sequence[Prompt], warmup: int = 1) -> dict:
    """HF generate, plain greedy (the baseline) vs the method's speculation, alternating per turn after a warm-up
    on each side: harness.bench.summarize over the requests, plus the generate settings and token identity. A prompt
    with follow-ups is a conversation: each side is fed its own answers (as `bench served --turns all` does)."""
    import torch
    from transformers import AutoModelForCausalLM

    from trt_spec.harness.bench import summarize
    from trt_spec.harness.prompts import conversation, render_conversation
    from trt_spec.in_triton.serving import default_end_id, encode, load_tokenizer
    from trt_spec.records.config import load_config
    from trt_spec.records.names import BASELINE, SPECULATIVE

    config = ROOT / METHODS[method].config
    cfg = load_config(config)
    sources, k = hf_sources(config), cfg.speculative.max_draft_len
    target_dir = sources["target"]
    tok = load_tokenizer(target_dir)
    model = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32, local_files_only=True).eval()
    if method == "hf-assisted":
        draft = AutoModelForCausalLM.from_pretrained(sources["draft"], dtype=torch.float32, local_files_only=True)
        settings = {"num_assistant_tokens": k}
        extra = {"assistant_model": draft.eval(), **settings}
    else:
        settings = extra = {"prompt_lookup_num_tokens": k}
    rounds = ForwardRounds(model)
    end = default_end_id(tok)

    def ids_of(p: Prompt, answers: list[str]) -> list[int]:
        if not getattr(tok, "chat_template", None):
            return encode(tok, p.text)
        return encode(tok, render_conversation(tok, conversation(p.turns, answers)))

    def turn(p: Prompt, answers: list[str], spec: bool):
        new, ttft, lat, rs = _hf_request(model, tok, rounds, p, ids_of(p, answers), extra if spec else {})
        new = new[:-1] if new and new[-1] == end else new  # the end token is not output (as served)
        return new, ttft, lat, rs, tok.decode(new, skip_special_tokens=True)

    for p in prompts[:warmup]:
        turn(p, [], False)
        turn(p, [], True)
    samples, identical, turns = [], 0, 0
    for i, p in enumerate(prompts):
        answers: dict[str, list[str]] = {BASELINE: [], SPECULATIVE: []}
        for t in range(1, len(p.turns) + 1):
            for side in (BASELINE, SPECULATIVE) if (i + t - 1) % 2 == 0 else (SPECULATIVE, BASELINE):
                new, ttft, lat, rs, text = turn(p, answers[side], side == SPECULATIVE)
                answers[side].append(text)
                samples.append(_hf_sample(side, i, p, new, ttft, lat, rs, side == SPECULATIVE, t, text))
            identical += answers[BASELINE][-1] == answers[SPECULATIVE][-1]
            turns += 1
        log(f"{method} {i + 1}/{len(prompts)} ({p.category})")
    rounds.handle.remove()
    res = summarize(samples, k, ids=[p.id for p in prompts])
    res.update(
        target=target_dir,
        draft=sources.get("draft") if method == "hf-assisted" else None,
        generate=settings,
        identical_outputs=identical,
        prompts=len(prompts),
        turns=turns,
    )
    return res


# --- served ----------------------------------------------------------------------------------------------------------


def run_served(method: str, prompts: Sequence[Prompt], out: Path) -> dict:
    """The config's deployment (built: --build builds first) served on tritonserver; `trt-spec bench served`'s paired
    A/B over the prompts."""
    from trt_spec.harness.bench import paired_ab
    from trt_spec.harness.prompts import with_chat_template

    with served(ROOT / METHODS[method].config, False, out) as (client, tok, manifest):
        res = paired_ab(client, with_chat_template(list(prompts), tok), warmup=1)
    res["k"] = res["k"] if res["k"] is not None else manifest.speculative.max_draft_len
    return res


# --- the table, the goals, the plot ----------------------------------------------------------------------------------


def cells(res: dict) -> dict:
    """category (and OVERALL) -> {speedup, speedup_ci95, mean_acceptance_length} of one method's bench result."""
    rows = res.get("categories") or []
    if not rows:  # one category: bench.per_category lists none, the overall row is that category's
        cats = {s["category"] for s in res["samples"]}
        rows = [{"category": c, **_overall(res)} for c in cats]
    out = {r["category"]: {k: r[k] for k in ("speedup", "speedup_ci95", "mean_acceptance_length")} for r in rows}
    out[OVERALL] = _overall(res)
    return out


def _overall(res: dict) -> dict:
    return {
        "speedup": res["speedup"],
        "speedup_ci95": res["speedup_ci95"],
        "mean_acceptance_length": res["acceptance"]["mean_acceptance_length"],
    }


def mean_over_categories(c: dict) -> float:
    xs = [v["speedup"] for k, v in c.items() if k != OVERALL]
    return sum(xs) / len(xs)


def goals(report: dict) -> list[tuple[str, str, str]]:
    """(goal, PASS|FAIL|NOT MEASURED, the numbers) for issue 32's goals, from this run's point estimates."""
    m = report["methods"]
    served_ = [k for k in m if METHODS[k].served]
    cats = [(k, c, v["speedup"]) for k in served_ for c, v in m[k]["cells"].items() if c != OVERALL]
    low = [f"{k} {c} {x:.3f}x" for k, c, x in cats if x < FLOOR]
    out = [
        (
            f"every category, every served mode >= {FLOOR}x",
            "NOT MEASURED" if not served_ else ("FAIL" if low else "PASS"),
            "below: " + ", ".join(low) if low else f"{', '.join(served_) or 'no served mode'} measured",
        )
    ]
    df = m.get(DRAFT_FREE, {}).get("mean_over_categories")
    peer = m.get(PEER, {}).get("mean_over_categories")
    out.append(
        (
            f"draft-free mean over categories >= {DRAFT_FREE_MIN}x",
            "NOT MEASURED" if df is None else ("PASS" if df >= DRAFT_FREE_MIN else "FAIL"),
            "" if df is None else f"{df:.2f}x",
        )
    )
    ratio = None if df is None or peer is None else df / peer
    out.append(
        (
            f"draft-free >= {OVER_PEER}x HF prompt lookup (means over categories)",
            "NOT MEASURED" if ratio is None else ("PASS" if ratio >= OVER_PEER else "FAIL"),
            "" if ratio is None else f"{df:.2f}x / {peer:.2f}x = {ratio:.2f}",
        )
    )
    return out


def _cell(v: Optional[dict]) -> str:
    if v is None:
        return "–"
    lo, hi = v["speedup_ci95"]
    tau = v["mean_acceptance_length"]
    return f"**{v['speedup']:.2f}x** ({lo:.2f}–{hi:.2f})" + ("" if tau is None else f", τ {tau:.2f}")


def markdown(report: dict) -> str:
    cats = report["categories"]
    per_cat = ", ".join(f"{c} {n}" for c, n in report["prompts_per_category"].items())
    lines = [
        f"## Spec-Bench, {report['date'][:10]}: speedup over each method's own greedy baseline (95% interval), "
        f"τ = mean accepted tokens",
        "",
        f"Served and HF, 1 in flight, greedy, chat template, {report['max_tokens']} max new tokens; questions per "
        f"category: {per_cat} (seed {report['seed']}; {len(report['left_out_too_long'])} questions left out as too "
        f"long for the deployments' limits); {report['machine']}.",
        "",
        "| Method | " + " | ".join(COLUMNS.get(c, c) for c in cats) + " | Overall | Mean of categories |",
        "|---|" + "---|" * (len(cats) + 2),
    ]
    for key, r in report["methods"].items():
        c = r["cells"]
        lines.append(
            f"| {METHODS[key].label} (k={r['k']}) | "
            + " | ".join(_cell(c.get(x)) for x in cats)
            + f" | {_cell(c[OVERALL])} | {r['mean_over_categories']:.2f}x |"
        )
    lines += ["", "| Goal | Result | |", "|---|---|---|"]
    lines += [f"| {g} | **{v}** | {why} |" for g, v, why in report["goals"]]
    return "\n".join(lines)


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = [*report["categories"], OVERALL]
    methods = list(report["methods"])
    width = 0.8 / max(len(methods), 1)
    fig, ax = plt.subplots(figsize=(max(6, 1.3 * len(groups) * max(1, len(methods) / 2)), 4.5))
    for j, key in enumerate(methods):
        c = report["methods"][key]["cells"]
        xs = [i + (j - (len(methods) - 1) / 2) * width for i in range(len(groups))]
        ys = [c[g]["speedup"] if g in c else 0.0 for g in groups]
        err = [
            [max(y - c[g]["speedup_ci95"][0], 0) if g in c else 0 for g, y in zip(groups, ys)],
            [max(c[g]["speedup_ci95"][1] - y, 0) if g in c else 0 for g, y in zip(groups, ys)],
        ]
        ax.bar(xs, ys, width, yerr=err, capsize=2, label=METHODS[key].label)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.axhline(FLOOR, color="red", linewidth=0.8, linestyle="--", label=f"{FLOOR}x floor")
    ax.set_xticks(range(len(groups)), [COLUMNS.get(g, g.title()) for g in groups], rotation=20, ha="right")
    ax.set_ylabel("speedup over own greedy baseline")
    ax.set_title(f"Spec-Bench on this machine, {report['date'][:10]} ({report['max_tokens']} tokens)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# --- main ------------------------------------------------------------------------------------------------------------


def parse(argv: Optional[list[str]]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--limit-per-category", type=int, default=3, help="questions per category")
    ap.add_argument("--max-tokens", type=int, default=DEFAULT_MAX_TOKENS, help="max new tokens, every request")
    ap.add_argument("--categories", nargs="*", default=[], help=f"of {', '.join(COLUMNS)} (default: all)")
    ap.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    ap.add_argument("--seed", type=int, default=0, help="which questions each category's slices give")
    ap.add_argument("--spec-bench", default=os.environ.get(SPEC_BENCH_ENV, str(SPEC_BENCH_DEFAULT)))
    ap.add_argument("--out", default="build/spec_bench")
    ap.add_argument("--build", action="store_true", help="build the methods' configs first")
    a = ap.parse_args(argv)
    if a.max_tokens < 1:
        ap.error(f"--max-tokens must be >= 1, got {a.max_tokens}")
    return a


def check_built(method: str) -> None:
    """A served method's build manifest, an HF method's checkpoint directories: there, else one ValueError line."""

    config = ROOT / METHODS[method].config
    fix = f"`trt-spec build {config.relative_to(ROOT)}` first, or --build"
    if METHODS[method].served:
        return check_built_config(config, method)
    roles = ("target", "draft") if method == "hf-assisted" else ("target",)
    for role, d in hf_sources(config).items():
        if role in roles and not (Path(d) / "config.json").is_file():
            raise ValueError(f"{method}: {d} (the {role} checkpoint) is not there: {fix}")


def check_built_config(config: Path, what: str = "") -> None:
    """A served config's build manifest: there, else one ValueError line."""
    from trt_spec.builder.pipeline import plan_for
    from trt_spec.records.config import load_config
    from trt_spec.records.manifest import BuildManifest, ManifestError

    try:
        BuildManifest.read(Path(plan_for(load_config(config), config).output_dir))
    except ManifestError:
        where = config.relative_to(ROOT) if config.is_relative_to(ROOT) else config
        raise ValueError(
            f"{what or config.stem}: {config.name} is not built: `trt-spec build {where}` first, or --build"
        )
    return None


def pick(a: argparse.Namespace) -> tuple[list[Prompt], list[str]]:
    """The questions of this run: those every deployment's limits fit (the three configs' smallest), then
    select_per_category; and the ids left out as too long."""
    from trt_spec.in_triton.serving import load_tokenizer
    from trt_spec.records.config import load_config

    cfgs = {m.config: load_config(ROOT / m.config) for m in METHODS.values()}
    targets = {cfgs[METHODS[m].config].target.checkpoint for m in a.methods}
    if len(targets) > 1:
        raise ValueError(f"the methods' configs name different targets ({', '.join(sorted(targets))}): one target only")
    for m in a.methods:  # what each method reads is there, before anything runs
        check_built(m)
    tdir = hf_sources(ROOT / METHODS[a.methods[0]].config)["target"]
    fit, left_out = fitting(
        spec_bench_prompts(Path(a.spec_bench), a.max_tokens),
        load_tokenizer(tdir),
        min(c.limits.max_input_len for c in cfgs.values()),
        min(c.limits.max_seq_len for c in cfgs.values()),
    )
    return select_per_category(fit, a.limit_per_category, a.seed, a.categories), left_out


def main(argv: Optional[list[str]] = None) -> int:
    from trt_spec.records.atomic import write_atomic

    a = parse(argv)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    if a.build:
        for config in dict.fromkeys(METHODS[m].config for m in a.methods):
            build_and_repo(ROOT / config, True)
    try:
        prompts, left_out = pick(a)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    import torch
    import transformers

    cats = list(dict.fromkeys(p.category for p in prompts))
    report: dict = {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}, "
        f"transformers {transformers.__version__}",
        "spec_bench": str(a.spec_bench),
        "seed": a.seed,
        "limit_per_category": a.limit_per_category,
        "max_tokens": a.max_tokens,
        "categories": [c for c in COLUMNS if c in cats] + [c for c in cats if c not in COLUMNS],
        "prompts_per_category": {c: sum(p.category == c for p in prompts) for c in cats},
        "questions": [{"id": p.id, "category": p.category} for p in prompts],
        "left_out_too_long": left_out,
        "methods": {},
    }
    for m in a.methods:
        t0 = time.monotonic()
        res = run_served(m, prompts, out) if METHODS[m].served else run_hf(m, prompts)
        res.update(label=METHODS[m].label, config=METHODS[m].config, seconds=time.monotonic() - t0)
        res["cells"] = cells(res)
        res["mean_over_categories"] = mean_over_categories(res["cells"])
        report["methods"][m] = res
        log(f"{m}: {res['speedup']:.2f}x overall, {res['mean_over_categories']:.2f}x mean of categories")
    report["goals"] = goals(report)
    md = markdown(report)
    write_atomic(out / "spec_bench.json", json.dumps(report, indent=2, default=float))
    write_atomic(out / "spec_bench.md", md + "\n")
    plot(report, out / "spec_bench.png")
    print(md)
    print("\nGoal checks (point estimates of this run):")
    for g, v, why in report["goals"]:
        print(f"  {v:<12} {g}" + (f": {why}" if why else ""))
    log(f"wrote {out / 'spec_bench.md'}, {out / 'spec_bench.json'}, {out / 'spec_bench.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
