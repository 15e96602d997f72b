"""Reports: report.json (raw samples, summary, environment), report.md (tables) and PNG plots."""

from __future__ import annotations

import json
import os
import platform
import sys
from datetime import datetime, timezone
from pathlib import Path

from ..records.atomic import write_atomic
from ..records.names import BASELINE, SPECULATIVE
from .metrics import fmt


def environment() -> dict:
    from ..builder.trtllm import dist_version as v

    return {
        "time": datetime.now(timezone.utc).isoformat(),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "packages": {d: v(d) for d in ("trt-spec", "tritonclient", "nvidia-pytriton", "torch", "tensorrt_llm")},
    }


def markdown(rep: dict) -> str:
    out = [f"# trt-spec report — {rep.get('title', '')}", "", f"Generated {rep['environment']['time']}.", ""]
    check = rep.get("check")
    if check:
        out += identity_table(check)
    for b in rep.get("bench", []):
        out += speedup_section(b)
    if rep.get("concurrency"):
        out += concurrency_table(rep["concurrency"])
    if rep.get("rate"):
        out += rate_table(rep["rate"])
    if rep.get("tune"):
        out += tune_section(rep["tune"])
    return "\n".join(out)


def identity_table(check: list[dict]) -> list[str]:
    """One row per identity check (protocol), then its divergences."""
    out = [
        "## Identity",
        "",
        "| protocol | prompts identical | real mismatches | near-ties | verdict |",
        "|---|---|---|---|---|",
    ]
    for c in check:
        out.append(
            f"| {c['protocol']} | {c['match_rate']:.0%} | {c['real_mismatches']} | {c['near_ties']} | "
            f"{'PASS' if c['passed'] else 'FAIL'} |"
        )
    out.append("")
    return out + divergence_table(check)


def speedup_section(b: dict) -> list[str]:
    """One bench run: baseline vs speculative side by side, the speedup and the acceptance."""
    a = b["acceptance"]
    pol = f", {b['draft_len_policy']}" if b.get("draft_len_policy") else ""
    out = [
        f"## Speedup ({b['protocol']}, {k_label(b['k'])}{pol})",
        "",
        "| | baseline | speculative |",
        "|---|---|---|",
        f"| output tokens/s | {b['baseline']['tokens_per_s']:.1f} | {b['speculative']['tokens_per_s']:.1f} |",
        f"| TTFT p50 (ms) | {b['baseline']['ttft_s']['p50'] * 1e3:.0f} | "
        f"{b['speculative']['ttft_s']['p50'] * 1e3:.0f} |",
        f"| TPOT p50 (ms) | {b['baseline']['tpot_s']['p50'] * 1e3:.1f} | "
        f"{b['speculative']['tpot_s']['p50'] * 1e3:.1f} |",
        f"| latency p50 (s) | {b['baseline']['latency_s']['p50']:.2f} | {b['speculative']['latency_s']['p50']:.2f} |",
        "",
        f"**Speedup {b['speedup']:.2f}x** (95% CI {b['speedup_ci95'][0]:.2f}–{b['speedup_ci95'][1]:.2f}), "
        f"acceptance rate {fmt(a['acceptance_rate'], '.2f')}, "
        f"mean acceptance length {fmt(a['mean_acceptance_length'], '.2f')}, "
        f"histogram {a['histogram']}; k chosen per round {a.get('draft_length_counts', [])} (counts of k = 0, "
        f"1, …), mean k when speculating {a.get('mean_draft_length', 0):.2f}, rounds without speculation "
        f"{a.get('rounds_without_speculation_share', 0):.0%}.",
        "",
    ]
    if a.get("source"):
        out += [f"Acceptance from {a['source']}" + "".join(f"; {n}" for n in a.get("notes", [])) + ".", ""]
    if b.get("order"):
        out += [f"Order: {b['order']}.", ""]
    if b.get("warning"):
        out += [f"> WARNING: {b['warning']}", ""]
    return (
        out
        + conversation_lines(b.get("conversations"))
        + category_table(b.get("categories") or [])
        + profile_table(b.get("profile"))
    )


def profile_table(p: dict | None) -> list[str]:
    """--profile: where the speculative requests' measured time went, then the target calls by tokens submitted."""
    if not p:
        return []
    n = p["requests"]
    out = [
        f"### Where the speculative requests' time went (--profile, {n} requests, {p['request_s']:.2f} s)",
        "",
        "| part | seconds | share | ms per request |",
        "|---|---|---|---|",
    ]
    for r in p["parts"]:
        out.append(f"| {r['label']} | {r['seconds']:.3f} | {fmt(r['share'], '.1%')} | {r['seconds'] / n * 1e3:.1f} |")
    out += [
        f"| **measured request time** | **{p['request_s']:.3f}** | 100% | {p['request_s'] / n * 1e3:.1f} |",
        "",
        "| target call | tokens | calls | seconds | mean ms |",
        "|---|---|---|---|---|",
    ]
    for c in p["calls"]:
        out.append(f"| {c['call']} | {c['tokens']} | {c['count']} | {c['seconds']:.3f} | {c['mean_s'] * 1e3:.2f} |")
    return out + ["", p["note"] + ".", ""]


def conversation_lines(c: dict | None) -> list[str]:
    """--turns all: turns both models answered alike, and each turn where they did not."""
    if not c:
        return []
    out = [f"Conversations (--turns all): {c['identical']} of {c['turns']} turns answered identically by both models."]
    if c["differ"]:
        where = ", ".join(f"prompt {d['prompt']} turn {d['turn']}" for d in c["differ"])
        out[0] = (
            f"> IDENTITY FAILURE: {c['turns'] - c['identical']} of {c['turns']} turns differ ({where}); {c['note']}."
        )
    out.append("")
    if c.get("per_turn"):
        out += turn_table("Per turn", "turn", [(str(r["turn"]), r) for r in c["per_turn"]])
    if c.get("per_conversation"):
        out += turn_table("Per conversation", "conversation", [(r["id"], r) for r in c["per_conversation"]])
    return out


def turn_table(title: str, what: str, rows: list[tuple[str, dict]]) -> list[str]:
    """Conversations' figures per turn index or per conversation (report.json: conversations.per_turn/...)."""
    out = [
        f"### {title}",
        "",
        f"| {what} | requests | baseline tok/s | speculative tok/s | speedup | 95% CI | tokens per target call | "
        "tokens from the cache | identical |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for label, r in rows:
        lo, hi = r["speedup_ci95"]
        out.append(
            f"| {label} | {r['requests']} | {fmt(r['baseline_tokens_per_s'], '.1f')} | "
            f"{fmt(r['speculative_tokens_per_s'], '.1f')} | {r['speedup']:.2f}x | {lo:.2f}–{hi:.2f} | "
            f"{fmt(r['tokens_per_target_call'], '.2f')} | {fmt(r['cache_share'], '.0%')} | "
            f"{fmt(r['identical'], 'd')}/{r['requests']} |"
        )
    return out + [
        "",
        "Tokens per target call: speculative output tokens / target calls. Tokens from the cache: the share of "
        "speculative output tokens accepted from proposals the cross-request suffix cache backed (each "
        "conversation runs under one tenant of its own; n/a: the server reports no count).",
        "",
    ]


def category_table(rows: list[dict]) -> list[str]:
    """Speedup and acceptance per prompt category (n/a where the server reports none)."""
    if not rows:
        return []
    turns = any(r.get("turns", r["prompts"]) != r["prompts"] for r in rows)
    out = [
        "### Per category",
        "",
        f"| category | prompts | {'turns | ' if turns else ''}speedup | 95% CI | mean acceptance length | "
        "acceptance rate | rounds without speculation |",
        "|---|---|---|---|---|---|---|" + ("---|" if turns else ""),
    ]
    for r in rows:
        lo, hi = r["speedup_ci95"]
        out.append(
            f"| {r['category']} | {r['prompts']} | " + (f"{r['turns']} | " if turns else "") + f"{r['speedup']:.2f}x | "
            f"{lo:.2f}–{hi:.2f} | "
            f"{fmt(r['mean_acceptance_length'], '.2f')} | {fmt(r['acceptance_rate'], '.2f')} | "
            f"{fmt(r['rounds_without_speculation_share'], '.0%')} |"
        )
    return out + [""]


def tune_section(t: dict) -> list[str]:
    """The k sweep, the recommended k (and how to apply it), adaptive against the best fixed k."""
    out = [
        "## k sweep",
        "",
        "| policy | k (cap) | speedup | 95% CI | acceptance | mean length | mean k when speculating | "
        "rounds without speculation |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in t["sweep"]:
        lo, hi = r["speedup_ci95"]
        out.append(
            f"| {r.get('policy', 'fixed')} | {r['k']} | {r['speedup']:.2f}x | {lo:.2f}–{hi:.2f} | "
            f"{fmt(r['acceptance_rate'], '.2f')} | {fmt(r['mean_acceptance_length'], '.2f')} | "
            f"{r.get('mean_draft_length', r['k']):.2f} | {r.get('rounds_without_speculation_share', 0):.0%} |"
        )
    out += [
        "",
        f"Recommended num_draft_tokens (fixed): **{t['recommended_k']}** ({t['note']}).",
        "",
        apply_k(t["recommended_k"]),
        "",
    ]
    a = t.get("adaptive_vs_best_fixed")
    if a:
        out += [
            f"Adaptive {a['adaptive']:.2f}x (95% CI {a['adaptive_ci95'][0]:.2f}–{a['adaptive_ci95'][1]:.2f}) vs "
            f"the best fixed k={a['best_fixed_k']} {a['best_fixed']:.2f}x (95% CI {a['best_fixed_ci95'][0]:.2f}–"
            f"{a['best_fixed_ci95'][1]:.2f}): ratio {a['ratio']:.2f}.",
            "",
        ]
    return out


def divergence_table(check: list[dict]) -> list[str]:
    """Every identity divergence, near-ties apart from real mismatches, with margin and gap."""
    rows = [(c, r) for c in check for r in c.get("results", []) if r.get("divergence")]
    if not rows:
        return []
    f = lambda v: "n/a" if v is None else f"{v:.4f}"  # noqa: E731
    out = [
        "| protocol | kind | token | baseline | speculative | top-2 margin | gap to best | near-tie below | "
        "probe | prompt |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for c, r in sorted(rows, key=lambda cr: cr[1]["divergence"]["kind"] != "near-tie"):
        d = r["divergence"]
        out.append(
            f"| {c['protocol']} | {d['kind']} | {d['index']} | {d['baseline_token']} | {d['speculative_token']} "
            f"| {f(d.get('margin'))} | {f(d.get('gap'))} | {c.get('near_tie_margin', 'n/a')} | "
            f"{d.get('probe', '')} | {repr(r['prompt'][:40]).replace('|', chr(92) + '|')} |"
        )
    return out + [""]


def apply_k(k: int) -> str:
    """How to apply a recommended k: per request, or as the deployment's default."""
    return (
        f'Apply it per request with the `num_draft_tokens` input ({k}; OpenAI API: `extra_body={{"num_draft_tokens": '
        f"{k}}}`, `trt-spec bench served --k {k}`), or as the deployment's default: "
        f"`speculative.num_draft_tokens: {k}` in the build config (or `--set speculative.num_draft_tokens={k}`), "
        "then `trt-spec repo` and serve again."
    )


def k_label(k) -> str:
    """A run's requested draft length as a label; None = the server's default."""
    return "k = the server's default" if k is None else f"k={k}"


def concurrency_table(rows: list[dict]) -> list[str]:
    """Concurrency sweep table: per level, one row per model."""
    out = [
        "## Concurrency sweep",
        "",
        "| in flight | model | requests | total tok/s | TPOT p50 (ms) | latency p50 (s) | latency p99 (s) | "
        "TTFT p50 (ms) | speedup | acceptance rate | mean acceptance length |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        a = r["acceptance"]
        slower = " (slower)" if r["speedup"] < 1.0 else ""
        for model, extra in (
            (BASELINE, "— | — | —"),
            (
                SPECULATIVE,
                f"**{r['speedup']:.2f}x{slower}** | "
                f"{fmt(a['acceptance_rate'], '.2f')} | {fmt(a['mean_acceptance_length'], '.2f')}",
            ),
        ):
            m = r[model]
            out.append(
                f"| {r['concurrency']} | {model} | {m['requests']} | {m['tokens_per_s']:.1f} | "
                f"{m['tpot_s']['p50'] * 1e3:.1f} | {m['latency_s']['p50']:.2f} | {m['latency_s']['p99']:.2f} | "
                f"{m['ttft_s']['p50'] * 1e3:.0f} | {extra} |"
            )
    out += [
        "",
        "Total tok/s: every generated token of the level over its wall time (all requests in flight "
        "together). TPOT, latency and TTFT: per request. Speedup: speculative / baseline total tok/s. "
        "Acceptance: summed over the level's speculative requests. (slower): speculation loses at that level. "
        "Raw samples: report.json.",
        "",
    ]
    return out


def rate_table(r: dict) -> list[str]:
    """Request-rate table: per model, throughput, latency and goodput."""
    slo = ", ".join(f"{k.split('_')[0].upper()} <= {v * 1e3:.0f} ms" for k, v in r["slo"].items() if v is not None)
    out = [
        f"## Request rate {r['request_rate']:g}/s (Poisson arrivals, {r['requests']} requests per model)",
        "",
        "| model | requests/s | total tok/s | TTFT p50 (ms) | TTFT p99 (ms) | TPOT p50 (ms) | latency p99 (s) | "
        "met SLO | goodput (req/s) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for model in (BASELINE, SPECULATIVE):
        m = r[model]
        out.append(
            f"| {model} | {m['request_rps']:.2f} | {m['tokens_per_s']:.1f} | {m['ttft_s']['p50'] * 1e3:.0f} | "
            f"{m['ttft_s']['p99'] * 1e3:.0f} | {m['tpot_s']['p50'] * 1e3:.1f} | {m['latency_s']['p99']:.2f} | "
            f"{m['slo_met']}/{m['requests']} | {m['goodput_rps']:.2f} |"
        )
    out += [
        "",
        f"Speedup (total tok/s) **{r['speedup']:.2f}x**, goodput ratio {r['goodput_ratio']:.2f} "
        f"(SLO: {slo or 'none: every request counts'}).",
        "",
    ]
    return out


def _levels_axis(ax, rows: list[dict]) -> None:
    """Concurrency levels on a log2 axis, labelled 1, 2, 4, 8 (not 2^0 ...)."""
    xs = [r["concurrency"] for r in rows]
    ax.set_xscale("log", base=2)
    ax.set_xticks(xs, [str(x) for x in xs])
    ax.minorticks_off()


def plots(rep: dict, out_dir: Path) -> list[Path]:
    """The PNG charts; none (one line on stderr) without matplotlib: the JSON and Markdown reports are the results."""
    try:
        import matplotlib
    except ImportError:
        print("note: no PNG charts: matplotlib is not installed (pip install matplotlib)", file=sys.stderr)
        return []

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    made = []

    def save(fig, name):
        p = out_dir / name
        tmp = p.with_name(f".{p.stem}.tmp-{os.getpid()}.png")
        fig.tight_layout()
        fig.savefig(tmp, dpi=110)
        plt.close(fig)
        os.replace(tmp, p)
        made.append(p)

    bench = rep.get("bench") or []
    if bench:
        b = bench[0]
        fig, ax = plt.subplots(figsize=(5, 3.5))
        ax.bar(
            ["baseline", "speculative"],
            [b["baseline"]["tokens_per_s"], b["speculative"]["tokens_per_s"]],
            color=["#888888", "#76b900"],
        )
        ax.set_ylabel("output tokens/s")
        ax.set_title(f"tokens/s ({b['protocol']}, speedup {b['speedup']:.2f}x)")
        save(fig, "tokens_per_s.png")
        hist = b["acceptance"]["histogram"]
        if hist:
            fig, ax = plt.subplots(figsize=(5, 3.5))
            ax.bar(range(len(hist)), hist, color="#76b900")
            ax.set_xlabel("draft tokens accepted per step")
            ax.set_ylabel("steps")
            ax.set_title(f"acceptance histogram (rate {fmt(b['acceptance']['acceptance_rate'], '.2f')})")
            save(fig, "acceptance_histogram.png")
    if rep.get("concurrency"):
        rows = rep["concurrency"]
        fig, ax = plt.subplots(figsize=(5, 3.5))
        ax.plot([r["concurrency"] for r in rows], [r["speedup"] for r in rows], "o-", color="#76b900")
        ax.axhline(1.0, color="gray", ls="--")
        _levels_axis(ax, rows)
        ax.set_xlabel("requests in flight")
        ax.set_ylabel("speedup (spec / baseline total tok/s)")
        ax.set_title("speedup vs concurrency")
        save(fig, "speedup_vs_concurrency.png")
        fig, ax = plt.subplots(figsize=(5, 3.5))
        for model, label, color in ((BASELINE, "baseline", "#888888"), (SPECULATIVE, "speculative", "#76b900")):
            ax.plot(
                [r["concurrency"] for r in rows],
                [r[model]["tokens_per_s"] for r in rows],
                "o-",
                color=color,
                label=label,
            )
        _levels_axis(ax, rows)
        ax.set_ylim(bottom=0)
        ax.set_xlabel("requests in flight")
        ax.set_ylabel("total output tokens/s")
        ax.set_title("throughput vs concurrency")
        ax.legend()
        save(fig, "throughput_vs_concurrency.png")
    if rep.get("tune"):
        rows = rep["tune"]["sweep"]
        fig, ax = plt.subplots(figsize=(5, 3.5))
        ax.plot([r["k"] for r in rows], [r["speedup"] for r in rows], "o-", color="#76b900")
        ax.axhline(1.0, color="gray", ls="--")
        ax.set_xlabel("num_draft_tokens (k)")
        ax.set_ylabel("speedup")
        ax.set_title("speedup vs k")
        save(fig, "speedup_vs_k.png")
    return made


def write_reports(rep: dict, out_dir: Path) -> list[Path]:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    rep = {**rep, "environment": rep.get("environment") or environment()}
    write_atomic(out_dir / "report.json", json.dumps(rep, indent=2, default=float) + "\n")
    write_atomic(out_dir / "report.md", markdown(rep))
    return [out_dir / "report.json", out_dir / "report.md", *plots(rep, out_dir)]
