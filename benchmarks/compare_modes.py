"""EAGLE vs n-gram vs the distilled draft model on the CPU deployment, on the same prompts, in one run.

For each config (default: build_configs/cpu-smollm2-{eagle,ngram,draft}.yaml; `trt-spec build` each first, or pass
--build): write its Triton repository, serve it on a real tritonserver, and for each prompt set run the paired A/B the
`bench` command runs (baseline `ensemble` vs speculative `tensorrt_llm_bls`, alternating, streamed, greedy, the target's
chat template applied) at 1 in flight (its speedup: records.speculation.paired_speedup, with a 95% interval), then
the concurrency sweep on the first set. Then, in process, over the same prompts on the served engines (the same StandIn
the python model wraps): per-position acceptance and mean acceptance length (records.speculation.acceptance_summary,
as the bench reports them: 1 + accepted / speculative rounds), the cost c of a draft step relative to a target decode
step, the verification cost r, and the Leviathan bound for the measured α and c.

    python benchmarks/compare_modes.py [--limit 8] [--max-tokens 96] [--sweep 1 2 4 8] [--out build/compare] [--build]

Prints one Markdown report (ratios measured in this run) and writes compare.json. Needs a quiet machine: a busy one
skews every ratio.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = (
    "build_configs/cpu-smollm2-eagle.yaml",
    "build_configs/cpu-smollm2-ngram.yaml",
    "build_configs/cpu-smollm2-draft.yaml",
)
SETS = (
    "chat-heldout=tests/data/chat_heldout.jsonl",
    "code-heldout=tests/data/code_heldout.jsonl",
    "chat=chat",
    "code=code",
)


def log(msg: str) -> None:
    print(f"[compare] {msg}", file=sys.stderr, flush=True)


def build_and_repo(config: Path, build: bool) -> tuple[Path, object]:
    """The config's build (run first with --build: resumable, but a build made by another interpreter path reruns),
    and a Triton repository written from it."""
    from trt_spec.builder.pipeline import plan_for
    from trt_spec.builder.runner import run_plan
    from trt_spec.records.config import load_config
    from trt_spec.records.manifest import BuildManifest
    from trt_spec.repository.writer import write_repository

    plan = plan_for(load_config(config), config)
    if build:
        t0 = time.monotonic()
        run_plan(plan, config_path=config)
        log(f"{config.name}: built ({time.monotonic() - t0:.0f} s)")
    manifest = BuildManifest.read(Path(plan.output_dir))
    repo = Path(plan.output_dir) / "compare_repo"
    write_repository(manifest, repo)
    return repo, manifest


@contextmanager
def served(config: Path, build: bool, log_dir: Path):
    """The config's deployment served on a real tritonserver (free ports, its log in log_dir): yields (client,
    tokenizer, manifest), the client a gRPC LLMClient with the target's tokenizer (what `trt-spec bench served
    --tokenizer` makes); the server is stopped on the way out."""
    from trt_spec.harness.client import LLMClient
    from trt_spec.in_triton.serving import load_tokenizer
    from trt_spec.serve.server import TritonServer, free_port

    repo, manifest = build_and_repo(config, build)
    tok = load_tokenizer(manifest.engines["target"].dir)
    server = TritonServer(
        repo,
        http_port=free_port(),
        grpc_port=free_port(),
        metrics_port=free_port(),
        log_path=log_dir / f"{config.stem}.log",
    )
    try:
        server.start().wait_ready(600)
        client = LLMClient(server.grpc_url, "grpc")
        client.use_tokenizer(tok)
        yield client, tok, manifest
    finally:
        server.stop()


def _median_s(f, n: int = 5) -> float:
    ts = []
    for _ in range(n + 1):  # the first run warms up
        t0 = time.perf_counter()
        f()
        ts.append(time.perf_counter() - t0)
    return sorted(ts[1:])[n // 2]


def costs_and_rounds(manifest, k: int, prompts, tokenizer) -> dict:
    """In process, on the served engines (the StandIn the python model wraps): the cost c of one draft step (EAGLE
    head step, draft-model decode step; 0 for n-gram) and the verification cost r (a (k + 1)-token forward), both in
    target decode steps; for an EAGLE engine also its per-round (drafted, accepted) counts over the prompts (greedy:
    the rounds the served engine runs), which the backend's perf outputs total but do not list."""
    import torch

    from trt_spec.records.speculation import AcceptanceCounts, acceptance_summary
    from trt_spec.reference.engine import Sampling, measure_draft_costs
    from trt_spec.reference.standin import StandIn

    params = {
        "gpt_model_type": "inflight_fused_batching",
        "gpt_model_path": manifest.engines["target"].dir,
        "enable_kv_cache_reuse": "true",
        "enable_chunked_context": "false",
        "tokenizer_dir": "",
        "xgrammar_tokenizer_info_path": "",
        "guided_decoding_backend": "",
    }
    target = StandIn.from_engine_dir("tensorrt_llm", params)
    eng, out = target.engine, {}
    try:
        if eng.head is not None:
            costs = measure_draft_costs(eng.model, eng.head, eng.max_draft_len)  # seconds: in decode steps here
            one = costs.forward_s[0]
            out["c"], out["r"] = costs.head_s / one, costs.forward_s[min(k, len(costs.forward_s) - 1)] / one
            rounds, lengths = [], []  # (drafted, accepted) per speculative step; k per policy round (0 = a run)
            for p in prompts:
                ids = tokenizer(p.text, add_special_tokens=True)["input_ids"]
                result = target.scheduler.submit_generate(ids, p.max_tokens, Sampling()).result()
                rounds += result.rounds
                lengths += result.draft_lengths
            spec = [a for d, a in rounds if d]  # accepted per speculative round
            hist = [spec.count(i) for i in range(max(k, *spec) + 1)] if spec else []
            acc = acceptance_summary(
                AcceptanceCounts(
                    requests=len(prompts),
                    accepted=sum(spec),
                    drafted=sum(d for d, _ in rounds),
                    steps=len(lengths),
                    speculative_rounds=len(spec),
                    rounds_without_speculation=lengths.count(0),
                    histogram=tuple(hist),
                    draft_length_counts=tuple(lengths.count(i) for i in range(max(lengths, default=0) + 1)),
                )
            )
            out["rounds"] = len(spec)
            out.update(
                {key: acc[key] for key in ("per_position_acceptance", "mean_acceptance_length", "acceptance_rate")}
            )
            return out
        model = eng.model
        cache = model.new_cache(1, 256)
        with torch.inference_mode():
            model.forward_packed(torch.zeros(64, dtype=torch.long), torch.arange(64), [(cache, 64)], torch.tensor([63]))

            def fwd(m, c, n):
                return lambda: m.forward_packed(
                    torch.zeros(n, dtype=torch.long), torch.arange(64, 64 + n), [(c, n)], torch.arange(n)
                )

            one = _median_s(fwd(model, cache, 1))
            out["r"] = _median_s(fwd(model, cache, k + 1)) / one
            out["c"] = 0.0
            if "draft" in manifest.engines:
                d = StandIn.from_engine_dir(
                    "tensorrt_llm_draft", {**params, "gpt_model_path": manifest.engines["draft"].dir}
                )
                try:
                    dm = d.engine.model
                    dc = dm.new_cache(1, 256)
                    dm.forward_packed(
                        torch.zeros(64, dtype=torch.long), torch.arange(64), [(dc, 64)], torch.tensor([63])
                    )
                    out["c"] = _median_s(fwd(dm, dc, 1)) / one
                finally:
                    d.close()
    finally:
        target.close()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", action="append", default=None, help="configs to compare (repeatable)")
    ap.add_argument("--set", action="append", default=None, help="NAME=SET_OR_JSONL prompt sets (repeatable)")
    ap.add_argument("--limit", type=int, default=8, help="prompts per set")
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--sweep", type=int, nargs="*", default=[1, 2, 4, 8], help="concurrency levels (first set)")
    ap.add_argument("--out", default="build/compare")
    ap.add_argument("--build", action="store_true", help="build the configs first (default: `trt-spec build` them)")
    a = ap.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    from trt_spec.harness.bench import concurrency_sweep, paired_ab
    from trt_spec.harness.prompts import Prompt, load_prompts, with_chat_template
    from trt_spec.records.config import load_config

    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    sets = {}
    for spec in a.set or SETS:
        name, src = spec.split("=", 1)
        sets[name] = [
            Prompt(p.text, a.max_tokens, p.id) for p in load_prompts(str(ROOT / src) if "/" in src else src)[: a.limit]
        ]
    report: dict = {"sets": {n: len(p) for n, p in sets.items()}, "max_tokens": a.max_tokens, "modes": {}}
    for config in a.config or CONFIGS:
        config = ROOT / config
        k = load_config(config).speculative.max_draft_len
        res: dict = {"config": str(config.relative_to(ROOT)), "k": k, "sets": {}}
        with served(config, a.build, out) as (client, tok, manifest):
            for name, prompts in sets.items():
                t0 = time.monotonic()
                r = paired_ab(client, with_chat_template(prompts, tok), warmup=1)
                log(f"{config.stem} {name}: {r['speedup']:.2f}x ({time.monotonic() - t0:.0f} s)")
                res["sets"][name] = {
                    key: r[key] for key in ("speedup", "speedup_ci95", "acceptance", "baseline", "speculative")
                }
            if a.sweep:
                first = with_chat_template(next(iter(sets.values())), tok)
                res["sweep"] = concurrency_sweep(client.clone, first, a.sweep, requests_per_level=len(first))
                log(
                    f"{config.stem} sweep: "
                    + ", ".join(f"{row['concurrency']}: {row['speedup']:.2f}x" for row in res["sweep"])
                )
        res["in_process"] = {
            name: costs_and_rounds(manifest, k, with_chat_template(prompts, tok), tok) for name, prompts in sets.items()
        }
        report["modes"][config.stem] = res
    (out / "compare.json").write_text(json.dumps(report, indent=2, default=float))
    print(markdown(report))
    return 0


def markdown(rep: dict) -> str:
    from trt_spec.records.speculation import leviathan_bound, solve_alpha

    names = list(rep["sets"])
    lines = [
        f"## EAGLE vs n-gram vs draft model: served, 1 in flight, greedy, {rep['max_tokens']} tokens, "
        f"{', '.join(f'{n} ({c} prompts)' for n, c in rep['sets'].items())}",
        "",
        "| config | " + " | ".join(f"{n}" for n in names) + " |",
        "|---|" + "---|" * len(names),
    ]
    for mode, r in rep["modes"].items():
        lines.append(
            f"| {mode} | "
            + " | ".join(
                f"**{r['sets'][n]['speedup']:.2f}x** ({r['sets'][n]['speedup_ci95'][0]:.2f}–"
                f"{r['sets'][n]['speedup_ci95'][1]:.2f})"
                for n in names
            )
            + " |"
        )
    lines += [
        "",
        "| config | set | k | acceptance rate | mean acceptance length | per-position acceptance | c | r | "
        "Leviathan bound |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for mode, r in rep["modes"].items():
        k = r["k"]
        for n in names:
            acc, ip = r["sets"][n]["acceptance"], r["in_process"][n]
            if "per_position_acceptance" in ip:  # in-engine: the served engine's rounds, in process
                ar, mal, pp = ip["acceptance_rate"], ip["mean_acceptance_length"], ip["per_position_acceptance"]
            else:
                ar, mal, pp = acc["acceptance_rate"], acc["mean_acceptance_length"], acc["per_position_acceptance"]
            alpha = solve_alpha(mal or 1.0, k)
            bound = leviathan_bound(alpha, k, ip["c"], ip["r"])
            lines.append(
                f"| {mode} | {n} | {k} | {'n/a' if ar is None else format(ar, '.2f')} | "
                f"{'n/a' if mal is None else format(mal, '.2f')} | {', '.join(f'{x:.2f}' for x in pp)} | "
                f"{ip['c']:.3f} | {ip['r']:.2f} | {bound:.2f}x |"
            )
    sweep = [r.get("sweep", []) for r in rep["modes"].values()]
    if any(sweep):
        levels = [row["concurrency"] for row in sweep[0]]
        lines += [
            "",
            f"Concurrency sweep ({names[0]}): speculative / baseline total tok/s",
            "",
            "| config | " + " | ".join(f"{c} in flight" for c in levels) + " |",
            "|---|" + "---|" * len(levels),
        ]
        for mode, r in rep["modes"].items():
            lines.append(f"| {mode} | " + " | ".join(f"{row['speedup']:.2f}x" for row in r.get("sweep", [])) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
