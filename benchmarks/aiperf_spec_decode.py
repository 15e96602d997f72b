"""AIPerf's Spec Decode section against trt-spec's OpenAI port, per Spec-Bench category, checked against the server.

For each config: its build served on a real tritonserver with the OpenAI frontend in front (the objects `trt-spec serve
--openai-port` starts), then per Spec-Bench leaderboard category one `aiperf profile` run (chat endpoint, streaming,
greedy, the category's first turns) whose JSON export's spec-decode metrics are compared with what the server itself
counted over that run (the speculative BLS's counters on Triton's metrics port, vLLM's names). AIPerf reads the
per-request acceptance from each response's `metrics.speculative_decoding` (vLLM's shape); the server counts it in
the BLS. Equal counts mean the ecosystem's instrument sees what trt-spec measured.

    python benchmarks/aiperf_spec_decode.py [--config build_configs/cpu-smollm2-ngram.yaml ...] [--build]
        [--limit-per-category 3] [--max-tokens 128] [--out build/aiperf-spec-decode]

Prints a Markdown table (and writes OUT/report.md, report.json). The build must exist (or pass --build). AIPerf comes
with the test extra (`make test-tools`), not with `make setup`.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from compare_modes import build_and_repo  # noqa: E402
from spec_bench import (  # noqa: E402
    COLUMNS,
    SPEC_BENCH_DEFAULT,
    SPEC_BENCH_ENV,
    fitting,
    select_per_category,
    spec_bench_prompts,
)

DEFAULT_CONFIGS = [ROOT / "build_configs" / "cpu-smollm2-ngram.yaml"]


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def server_counts(metrics_url: str) -> dict:
    """The speculative model's counters (vLLM's names, as the BLS publishes them) and its accepted-length histogram."""
    from trt_spec.in_triton.spec_metrics import histogram, scrape, value
    from trt_spec.records import names as n

    m = scrape(metrics_url)
    labels = {"model_name": n.SPECULATIVE, "engine": "0"}
    cum = [c for le, c in histogram(m, n.METRIC_ACCEPTED_LENGTH, model=n.SPECULATIVE).items() if le != float("inf")]
    return {
        "accepted": int(value(m, n.VLLM_NUM_ACCEPTED_TOKENS, **labels)),
        "drafted": int(value(m, n.VLLM_NUM_DRAFT_TOKENS, **labels)),
        "steps": int(value(m, n.VLLM_NUM_DRAFTS, **labels)),
        "hist": [int(c - (cum[i - 1] if i else 0)) for i, c in enumerate(cum)],
    }


def delta(before: dict, after: dict) -> dict:
    return {
        **{k: after[k] - before[k] for k in ("accepted", "drafted", "steps")},
        "hist": [a - b for a, b in zip(after["hist"], before["hist"])],
    }


def aiperf_run(url: str, tokenizer: str, prompts: list, max_tokens: int, out: Path) -> dict:
    """One `aiperf profile` over the prompts (one request each, concurrency 1); its JSON export."""
    from trt_spec.records.names import SPECULATIVE

    out.mkdir(parents=True, exist_ok=True)
    data = out / "prompts.jsonl"
    data.write_text("".join(json.dumps({"text": p.text}) + "\n" for p in prompts))
    aiperf = shutil.which("aiperf") or str(Path(sys.executable).with_name("aiperf"))
    # aiperf resolves a tokenizer path as a hub name unless offline mode is off (see tests/e2e/test_openai.py)
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    argv = [
        aiperf, "profile", "--model", SPECULATIVE, "--url", url, "--endpoint-type", "chat", "--streaming",
        "--request-count", str(len(prompts)), "--concurrency", "1", "--input-file", str(data),
        "--custom-dataset-type", "single_turn", "--tokenizer", tokenizer, "--artifact-dir", str(out / "aiperf"),
        "--ui", "none", "--extra-inputs", "temperature:0", "--extra-inputs", f"max_tokens:{max_tokens}",
    ]  # fmt: skip
    p = subprocess.run(argv, capture_output=True, text=True, timeout=1800, env=env)
    (out / "aiperf.log").write_text(p.stdout + p.stderr)
    if p.returncode != 0:
        raise RuntimeError(f"aiperf failed ({p.returncode}); its output: {out / 'aiperf.log'}")
    return json.loads((out / "aiperf" / "profile_export_aiperf.json").read_text())


def compare(rep: dict, counted: dict) -> dict:
    """AIPerf's export next to the server's counts; `equal` when the counts, steps and histogram all agree."""

    def avg(key):
        return (rep.get(key) or {}).get("avg")

    pooled = {int(j): c for j, c in (rep.get("pooled_spec_decode_acceptance_histogram") or {}).items()}
    aiperf = {
        "accepted": avg("total_accepted_draft_tokens"),
        "drafted": avg("total_draft_tokens"),
        "steps": avg("total_spec_decode_steps"),
        "hist": pooled,
        "acceptance_rate_pct": avg("spec_decode_overall_draft_acceptance_rate"),
        "errors": (rep.get("error_request_count") or {}).get("avg", 0),
    }
    server_hist = {j: c for j, c in enumerate(counted["hist"]) if c}
    equal = (
        aiperf["accepted"] == counted["accepted"]
        and aiperf["drafted"] == counted["drafted"]
        and aiperf["steps"] == counted["steps"]
        and pooled == server_hist
    )
    rate = 100 * counted["accepted"] / counted["drafted"] if counted["drafted"] else None
    return {"aiperf": aiperf, "server": {**counted, "acceptance_rate_pct": rate}, "equal": equal}


def questions(config, manifest, args) -> list:
    """The Spec-Bench first turns this deployment's limits fit, limit_per_category of each (spec_bench's choice)."""
    from trt_spec.in_triton.serving import load_tokenizer
    from trt_spec.records.config import load_config

    lim = load_config(config).limits
    fit, _ = fitting(
        spec_bench_prompts(args.spec_bench, args.max_tokens),
        load_tokenizer(manifest.engines["target"].dir),
        lim.max_input_len,
        lim.max_seq_len,
    )
    return select_per_category(fit, args.limit_per_category, args.seed)


def run_config(config: Path, args, out: Path) -> list[dict]:
    from trt_spec.serve.openai.process import FrontendProcess
    from trt_spec.serve.server import TritonServer, free_port

    repo, manifest = build_and_repo(config, args.build)
    prompts, max_tokens = questions(config, manifest, args), args.max_tokens
    server = TritonServer(
        repo, http_port=free_port(), grpc_port=free_port(), metrics_port=free_port(), log_path=out / "triton.log"
    )
    rows = []
    try:
        server.start().wait_ready(600)
        fe = FrontendProcess(repo, server.grpc_url, free_port(), "127.0.0.1", out / "openai.log").start()
        try:
            fe.wait_ready(120)
            metrics = f"http://127.0.0.1:{server.metrics_port}/metrics"
            tokenizer = manifest.engines["target"].dir
            for cat in COLUMNS:
                todo = [p for p in prompts if p.category == cat]
                if not todo:
                    continue
                t0 = time.monotonic()
                before = server_counts(metrics)
                rep = aiperf_run(fe.url, tokenizer, todo, max_tokens, out / cat)
                row = {"config": config.stem, "category": cat, "requests": len(todo)}
                row.update(compare(rep, delta(before, server_counts(metrics))))
                rows.append(row)
                log(f"{config.stem} {cat}: {'equal' if row['equal'] else 'DIFFERENT'} ({time.monotonic() - t0:.0f} s)")
        finally:
            fe.stop()
    finally:
        server.stop()
    return rows


def markdown(rows: list[dict], args) -> str:
    head = (
        f"AIPerf Spec Decode vs the server's own counts (chat, streaming, greedy, {args.max_tokens} tokens, "
        f"{args.limit_per_category} Spec-Bench first turns per category, concurrency 1)\n\n"
        "| config | category | AIPerf accepted / drafted / steps | server accepted / drafted / steps "
        "| acceptance rate | histogram (accepted: steps) | equal |\n|---|---|---|---|---|---|---|\n"
    )
    lines = []
    for r in rows:
        a, s = r["aiperf"], r["server"]
        rate = f"{a['acceptance_rate_pct']:.1f}%" if a["acceptance_rate_pct"] is not None else "n/a"
        hist = ", ".join(f"{j}: {c}" for j, c in sorted(a["hist"].items())) or "none"
        lines.append(
            f"| {r['config']} | {r['category']} | {a['accepted']:g} / {a['drafted']:g} / {a['steps']:g} "
            f"| {s['accepted']} / {s['drafted']} / {s['steps']} | {rate} | {hist} | {'yes' if r['equal'] else 'NO'} |"
        )
    return head + "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", type=Path, action="append", help="a CPU config (repeatable; default: n-gram)")
    ap.add_argument("--build", action="store_true", help="build the configs first (resumable)")
    ap.add_argument("--spec-bench", type=Path, default=Path(os.environ.get(SPEC_BENCH_ENV, SPEC_BENCH_DEFAULT)))
    ap.add_argument("--limit-per-category", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--out", type=Path, default=ROOT / "build" / "aiperf-spec-decode")
    ap.add_argument("--seed", type=int, default=0, help="which questions of each category (spec_bench's choice)")
    args = ap.parse_args(argv)
    if not args.spec_bench.is_file():
        print(f"error: Spec-Bench's question.jsonl is not at {args.spec_bench}: pass --spec-bench", file=sys.stderr)
        return 2
    rows = []
    for config in args.config or DEFAULT_CONFIGS:
        out = args.out / config.stem
        out.mkdir(parents=True, exist_ok=True)
        rows += run_config(config, args, out)
    md = markdown(rows, args)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "report.md").write_text(md)
    (args.out / "report.json").write_text(json.dumps(rows, indent=2))
    print(md)
    return 0 if all(r["equal"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
