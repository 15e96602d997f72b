"""`trt-spec demo` (`make demo`): build -> repository -> serve -> identity check -> A/B benchmark -> concurrency
sweep -> one OpenAI chat call -> reports, on one machine; returns a verdict dict.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from .builder.pipeline import plan_for
from .builder.runner import run_plan
from .harness.bench import concurrency_sweep, paired_ab
from .harness.client import LLMClient
from .harness.identity import check_greedy
from .harness.metrics import fmt
from .harness.prompts import load_prompts, with_chat_template
from .harness.report import write_reports
from .in_triton.spec_metrics import scrape, scraped_acceptance
from .records.config import load_config
from .records.defaults import PROMPT_SET, REPO_SUBDIR
from .records.manifest import BuildManifest
from .records.names import BASELINE, SPECULATIVE, TEXT_MODELS
from .repository.writer import write_repository
from .serve.server import TritonServer, free_port


@dataclass
class DemoSettings:
    prompt_set: str = PROMPT_SET
    check_prompts: int = 2
    check_tokens: int = 40
    bench_prompts: int = 3
    bench_tokens: int = 64
    concurrency: tuple[int, ...] = (1, 2, 4, 8)  # requests in flight
    concurrency_requests: int = 8  # per level and model, rounded up to a multiple of the level
    concurrency_tokens: int = 24
    openai_tokens: int = 32


def run_demo(config: Path, out: Path, s: DemoSettings = DemoSettings(), say: Callable[[str], None] = print) -> dict:
    cfg = load_config(config)
    say(f"[1/5] build {config} (incremental: reruns only what changed)")
    plan = plan_for(cfg, config)
    run_plan(
        plan,
        config_path=config,
        on_event=lambda ev, st, i, n: say(f"      {st.name}: {ev}") if ev in ("start", "skip", "done") else None,
    )
    build_dir = Path(plan.output_dir)
    manifest = BuildManifest.read(build_dir)
    repo = out / REPO_SUBDIR
    say(f"[2/5] write the Triton model repository {repo}")
    write_repository(manifest, repo)
    tokenizer_dir = manifest.target.dir
    say("[3/5] start tritonserver")
    server = TritonServer(
        repo, http_port=free_port(), grpc_port=free_port(), metrics_port=free_port(), log_path=out / "tritonserver.log"
    )
    out.mkdir(parents=True, exist_ok=True)
    report: dict = {"title": f"demo {cfg.resolved_name(config)}", "check": [], "bench": []}
    with server:
        say(f"      ready: HTTP {server.http_url}, gRPC {server.grpc_url}")
        from .in_triton.serving import load_tokenizer

        tok = load_tokenizer(tokenizer_dir)
        check_prompts = with_chat_template(load_prompts(s.prompt_set, s.check_tokens)[: s.check_prompts], tok)
        bench_prompts = with_chat_template(load_prompts(s.prompt_set, s.bench_tokens)[: s.bench_prompts], tok)
        for proto, url in (("http", server.http_url), ("grpc", server.grpc_url)):
            client = LLMClient(url, proto)
            client.check_ready(list(TEXT_MODELS))
            say(f"[4/5] identity check over {proto} ({len(check_prompts)} prompts)")
            rep = check_greedy(client, check_prompts, tokenizer=tok)
            report["check"].append(rep.to_dict())
            say(f"[5/5] paired A/B benchmark over {proto} ({len(bench_prompts)} prompts, streaming)")
            report["bench"].append({"protocol": proto, **paired_ab(client, bench_prompts)})
        say(
            f"      concurrency sweep over gRPC: {list(s.concurrency)} in flight, {s.concurrency_requests} requests "
            f"of up to {s.concurrency_tokens} tokens per level and model"
        )
        conc_prompts = with_chat_template(load_prompts(s.prompt_set, s.concurrency_tokens), tok)
        report["concurrency"] = concurrency_sweep(
            lambda: LLMClient(server.grpc_url, "grpc"),
            conc_prompts,
            s.concurrency,
            requests_per_level=s.concurrency_requests,
        )
        url = f"http://{server.http_url.rsplit(':', 1)[0]}:{server.metrics_port}/metrics"
        say(f"      speculation metrics from the server: {url}")
        try:
            report["server_metrics"] = {"url": url, **scraped_acceptance(scrape(url), SPECULATIVE)}
        except (OSError, ValueError) as e:  # the benchmark stands without them
            report["server_metrics"] = {"url": url, "error": str(e)}
        report["openai"] = openai_call(repo, server, out, s, say)
    files = write_reports(report, out)
    report["files"] = [str(f) for f in files]
    report["passed"] = all(c["passed"] for c in report["check"])
    return report


def openai_call(repo: Path, server: TritonServer, out: Path, s: DemoSettings, say: Callable[[str], None]) -> dict:
    """Start the OpenAI frontend and stream one chat completion through the `openai` SDK."""
    import openai

    from .serve.openai.process import FrontendProcess

    fe = FrontendProcess(server.served, server.grpc_url, free_port(), "127.0.0.1", out / "openai.log").start()
    try:
        fe.wait_ready()
        say(f"      OpenAI API at {fe.url}/v1: one chat completion ({SPECULATIVE}, streamed)")
        client = openai.OpenAI(base_url=f"{fe.url}/v1", api_key="none", max_retries=0, timeout=300)
        question = load_prompts("chat", s.openai_tokens)[0].text
        text, usage = [], None
        for c in client.chat.completions.create(
            model=SPECULATIVE,
            messages=[{"role": "user", "content": question}],
            max_tokens=s.openai_tokens,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        ):
            usage = c.usage or usage
            if c.choices and c.choices[0].delta.content:
                text.append(c.choices[0].delta.content)
        return {
            "url": f"{fe.url}/v1",
            "question": question,
            "answer": "".join(text),
            "usage": usage.model_dump() if usage else None,
            "curl": f"curl -s {fe.url}/v1/chat/completions -H 'Content-Type: application/json' -d "
            f'\'{{"model": "{SPECULATIVE}", "messages": [{{"role": "user", "content": '
            f'"Hello"}}], "max_tokens": 32}}\'',
        }
    except (openai.APIError, RuntimeError) as e:  # the demo's verdict stands without it
        return {"url": f"{fe.url}/v1", "error": str(e)}
    finally:
        fe.stop()


def format_sweep(rows: list[dict]) -> list[str]:
    """The concurrency sweep as a text table."""
    out = [
        f"{'in flight':>9}{'base tok/s':>12}{'spec tok/s':>12}{'speedup':>9}{'accept':>8}{'mean len':>9}"
        f"{'TPOT ms base/spec':>19}{'p99 s base/spec':>17}"
    ]
    for r in rows:
        b, s = r[BASELINE], r[SPECULATIVE]
        tpot = f"{b['tpot_s']['p50'] * 1e3:.1f}/{s['tpot_s']['p50'] * 1e3:.1f}"
        p99 = f"{b['latency_s']['p99']:.2f}/{s['latency_s']['p99']:.2f}"
        out.append(
            f"{r['concurrency']:>9}{b['tokens_per_s']:>12.1f}{s['tokens_per_s']:>12.1f}{r['speedup']:>8.2f}x"
            f"{fmt(r['acceptance']['acceptance_rate'], '>8.2f')}"
            f"{fmt(r['acceptance']['mean_acceptance_length'], '>9.2f')}"
            f"{tpot:>19}{p99:>17}"
        )
    return out


def format_server_metrics(m: dict) -> list[str]:
    """The BLS's trt_spec_* Prometheus metrics over the whole demo."""

    def f(key: str, spec: str) -> str:
        return "n/a" if m[key] is None else format(m[key], spec)

    head = f"speculation metrics scraped from {m['url']} ({SPECULATIVE}, every request of the demo):"
    if "error" in m:
        return [head, f"  not available: {m['error']}"]
    return [
        head,
        f"  requests {m['requests']}, drafted {m['drafted']}, accepted {m['accepted']}, "
        f"acceptance rate {f('acceptance_rate', '.2f')}",
        f"  rounds {m['rounds']}, without speculation {f('no_speculation_share', '.1%')}, mean acceptance length "
        f"{f('mean_acceptance_length', '.2f')} (1 + accepted / speculative rounds)",
    ]


def format_verdict(rep: dict) -> str:
    lines = ["", "=" * 72]
    for c in rep["check"]:
        lines.append(
            f"identity over {c['protocol']:<4}: {c['match_rate']:.0%} of prompts token-identical, "
            f"{c['real_mismatches']} real mismatch(es) -> {'PASS' if c['passed'] else 'FAIL'}"
        )
    lines.append("")
    lines.append(
        f"{'protocol':<9}{'baseline tok/s':>15}{'spec tok/s':>12}{'speedup':>9}{'95% CI':>15}"
        f"{'accept':>8}{'mean len':>9}{'TTFT ms':>9}"
    )
    for b in rep["bench"]:
        lines.append(
            f"{b['protocol']:<9}{b['baseline']['tokens_per_s']:>15.1f}{b['speculative']['tokens_per_s']:>12.1f}"
            f"{b['speedup']:>8.2f}x{b['speedup_ci95'][0]:>8.2f}-{b['speedup_ci95'][1]:<6.2f}"
            f"{fmt(b['acceptance']['acceptance_rate'], '>8.2f')}"
            f"{fmt(b['acceptance']['mean_acceptance_length'], '>9.2f')}"
            f"{b['speculative']['ttft_s']['p50'] * 1e3:>9.0f}"
        )
    for b in rep["bench"]:
        if b.get("warning"):
            lines.append(f"WARNING ({b['protocol']}): {b['warning']}")
    if rep.get("concurrency"):
        lines += ["", *format_sweep(rep["concurrency"])]
    if rep.get("server_metrics"):
        lines += ["", *format_server_metrics(rep["server_metrics"])]
    o = rep.get("openai")
    if o:
        lines += ["", f"OpenAI API ({o['url']}, trt-spec serve --openai-port):"]
        if "error" in o:
            lines.append(f"  not available: {o['error']}")
        else:
            u = o["usage"] or {}
            lines += [
                f"  chat {SPECULATIVE}: {o['question'][:60]!r} -> {o['answer'][:100]!r}",
                f"  usage: {u.get('prompt_tokens')} prompt + {u.get('completion_tokens')} completion tokens",
                f"  try: {o['curl']}",
            ]
    lines.append("")
    lines.append(f"verdict: {'PASS' if rep['passed'] else 'FAIL'} — reports: " + ", ".join(rep.get("files", [])))
    lines.append("=" * 72)
    return "\n".join(lines)
