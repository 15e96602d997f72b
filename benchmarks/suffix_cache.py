"""The n-gram deployment's cross-request suffix cache, served: cache on vs off in one run, paired.

The repository is written from the n-gram build's manifest (default build_configs/cpu-smollm2-ngram.yaml; `trt-spec
build` it first) with speculative.suffix_cache.scope = tenant, and served on a real tritonserver. One server gives all
three arms: `baseline` (the ensemble), `off` (the speculative BLS without a tenant: under scope tenant such a request
neither reads nor writes the cache, exactly the proposer without it) and `on` (the BLS with one tenant for the whole
run, so its store holds every earlier `on` request). Each measured prompt goes to the three arms in a rotating order
(streamed, greedy, the target's chat template applied), after a one-token baseline request that leaves the prompt's
KV blocks in the engine's prefix cache for all three (else the first arm alone pays the prefill: seconds for a long
prompt on this CPU), and after one warm-up request per arm at the start (the `on` one under another tenant, so nothing
measured is in the cache before its time). The arms share the deployment's adaptive policy state (its measured costs
and draft-free acceptance), as requests with and without the cache do when served; --policy fixed takes the policy out
of the comparison (every round verifies what the proposer offers).

Workloads:
- code-edit, repeated (where the cache should help): each task of a held-out code-edit file (default
  tests/data/code_edit_heldout.jsonl; never tuned on) is first sent once to `on` (the earlier conversation: it fills the
  cache and warms the engine's prefix cache for every arm alike), then measured twice: `repeat`, the same request again
  (a retry, a regenerated answer, a restarted agent), and `edit`, the same task with a small change to its instruction
  (EDIT_SUFFIX appended to the instruction's first paragraph).
- Spec-Bench (where it may not help): --per-category questions of each category of Spec-Bench's question.jsonl
  ($TRT_SPEC_SPEC_BENCH, else ../shared/datasets/spec_bench/question.jsonl; first turns), evenly spaced in file order,
  the ones that fit the deployment's limits; MT-Bench's eight categories grouped as Spec-Bench's leaderboard groups
  them. The `on` tenant's cache grows over the run: each question may be proposed the earlier answers.

Figures per workload and group: speedup over the baseline of `off` and of `on`, and `on` over `off` (the cache's own
effect), each records.speculation.paired_speedup (Σ seconds / Σ seconds, paired bootstrap 95% interval); mean accepted
tokens per speculative round of each arm (1 + accepted / rounds that verified drafts, as the bench reports it); token
identity of both arms against the baseline; from the server's Prometheus metrics, rounds whose proposal drew on the
cache and the draft tokens they got accepted.

    python benchmarks/suffix_cache.py [--limit 10] [--per-category 3] [--max-tokens 128] [--policy fixed]
        [--out build/suffix_cache]
    python benchmarks/suffix_cache.py --limit 2 --per-category 1 --max-tokens 16   # a smoke run

Prints a Markdown report and writes suffix_cache.md and suffix_cache.json (every request too). Ratios are only
meaningful from one run on a quiet machine.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import uuid
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

CONFIG = "build_configs/cpu-smollm2-ngram.yaml"
CODE_EDIT = "tests/data/code_edit_heldout.jsonl"
SPEC_BENCH_ENV = "TRT_SPEC_SPEC_BENCH"
SPEC_BENCH_DEFAULT = ROOT.parent / "shared" / "datasets" / "spec_bench" / "question.jsonl"
MT_BENCH = ("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities")
EDIT_SUFFIX = " Keep every comment and blank line as it is."  # the `edit` follow-up's small change (not tuned)
ARMS = ("baseline", "off", "on")


def log(msg: str) -> None:
    print(f"[suffix-cache] {msg}", file=sys.stderr, flush=True)


# --- the deployment ------------------------------------------------------------------------------------------------


def repository(config: Path, out: Path):
    """The build's manifest with the cache scoped per tenant, and a Triton repository written from it under out/."""
    from trt_spec.builder.pipeline import plan_for
    from trt_spec.records.config import load_config
    from trt_spec.records.manifest import BuildManifest
    from trt_spec.repository.writer import write_repository

    plan = plan_for(load_config(config), config)
    manifest = BuildManifest.read(Path(plan.output_dir))
    spec = manifest.config.speculative
    if spec.mode != "ngram" or spec.proposer != "suffix":
        sys.exit(
            f"{config}: the suffix cache serves n-gram mode's suffix proposer; this build is {spec.mode} / "
            f"{spec.proposer}"
        )
    spec.suffix_cache.scope = "tenant"  # on = a tenant, off = none: both arms on one server
    repo = out / "repo"
    write_repository(manifest, repo)
    return repo, manifest


# --- prompts -------------------------------------------------------------------------------------------------------


def code_edit_items(path: Path, limit: int) -> list[dict]:
    """Each task: its first request, and the two follow-ups measured (the same request; a small change to it)."""
    from trt_spec.harness.prompts import load_prompts

    items = []
    for p in load_prompts(str(path))[:limit]:
        head, sep, rest = p.text.partition("\n\n")
        edited = replace(p, text=head + EDIT_SUFFIX + sep + rest, id=f"{p.id}+edit")
        items.append({"id": p.id, "first": p, "repeat": p, "edit": edited})
    return items


def spec_bench_prompts(per_category: int, tokenizer, max_input_len: int, room: int, max_tokens: int) -> list:
    """per_category questions of each category, evenly spaced over those that fit, in file order per category."""
    from trt_spec.harness.prompts import load_prompts, with_chat_template
    from trt_spec.in_triton.serving import encode

    path = Path(os.environ.get(SPEC_BENCH_ENV) or SPEC_BENCH_DEFAULT)
    if not path.is_file():
        sys.exit(f"Spec-Bench's question.jsonl is not at {path}; set {SPEC_BENCH_ENV} to its path")
    by_cat: dict[str, list] = {}
    for p in load_prompts(str(path), max_tokens):
        n = len(encode(tokenizer, with_chat_template([p], tokenizer)[0].text))
        if n <= max_input_len and n + max_tokens <= room:
            by_cat.setdefault("mt_bench" if p.category in MT_BENCH else p.category, []).append(p)
    picked = []
    for cat, ps in by_cat.items():
        step = len(ps) / min(per_category, len(ps))
        picked += [replace(ps[int(i * step)], category=cat) for i in range(min(per_category, len(ps)))]
    return picked


# --- measuring -----------------------------------------------------------------------------------------------------


class Arms:
    """The three arms over one client; `on` sends the run's tenant."""

    def __init__(self, client, tokenizer, tenant: str, policy: str | None = None):
        self.client, self.tok, self.tenant, self.policy = client, tokenizer, tenant, policy

    def send(self, arm: str, p, tenant: str | None = None) -> dict:
        from trt_spec.harness.prompts import with_chat_template
        from trt_spec.records.names import BASELINE, SPECULATIVE

        text = with_chat_template([p], self.tok)[0].text
        extra = {"tenant": tenant or self.tenant} if arm == "on" else {}
        if arm != "baseline" and self.policy:
            extra["draft_len_policy"] = self.policy
        g = self.client.generate(
            BASELINE if arm == "baseline" else SPECULATIVE,
            text,
            p.max_tokens,
            stream=True,
            exclude_input_in_output=True,
            **extra,
        )
        m = g.metrics
        hist = m.get("accepted_length_histogram") or []
        return {
            "latency_s": g.latency_s,
            "tokens": g.num_tokens,
            "ids": list(g.output_ids),
            "accepted": int(m.get("total_accepted_draft_tokens", 0)),
            "drafted": int(m.get("total_draft_tokens", 0)),
            "rounds": int(sum(hist)),
        }

    def measure(self, p, i: int) -> dict:
        """The prompt on the three arms, in an order rotating with i, after a one-token baseline request: the engine
        then holds the prompt's KV blocks (enable_kv_cache_reuse) for every arm, so none pays its prefill alone."""
        self.send("baseline", replace(p, max_tokens=1))
        order = ARMS[i % 3 :] + ARMS[: i % 3]
        out = {arm: self.send(arm, p) for arm in order}
        return {"id": p.id, "category": p.category, "order": list(order), **out}


def code_edit_run(arms: Arms, items: list[dict]) -> list[dict]:
    rows, i = [], 0
    for it in items:
        arms.send("on", it["first"])  # the earlier conversation: into the tenant's cache
        for kind in ("repeat", "edit"):
            rows.append({**arms.measure(it[kind], i), "category": kind})
            i += 1
        log(f"code-edit {it['id']}: done")
    return rows


def spec_bench_run(arms: Arms, prompts: list) -> list[dict]:
    rows = []
    for i, p in enumerate(prompts):
        rows.append(arms.measure(p, i))
        if (i + 1) % 5 == 0 or i + 1 == len(prompts):
            log(f"spec-bench: {i + 1}/{len(prompts)}")
    return rows


def cache_counters(server) -> dict:
    """The BLS's suffix-cache counters so far (its Prometheus metrics)."""
    from trt_spec.in_triton.spec_metrics import scrape, value
    from trt_spec.records import names as n

    s = scrape(f"http://127.0.0.1:{server.metrics_port}/metrics")
    return {
        "cache_rounds": value(s, n.METRIC_CACHE_ROUNDS),
        "cache_accepted": value(s, n.METRIC_CACHE_ACCEPTED),
        "rounds": value(s, n.METRIC_ROUNDS),
        "cache_tokens": value(s, n.METRIC_CACHE_TOKENS),
    }


# --- figures -------------------------------------------------------------------------------------------------------


def figures(rows: list[dict]) -> dict:
    from trt_spec.records.speculation import mean_acceptance_length, paired_speedup

    def speedup(a: str, b: str) -> list[float]:
        return list(paired_speedup([r[a]["latency_s"] for r in rows], [r[b]["latency_s"] for r in rows]))

    def mal(arm: str):
        return mean_acceptance_length(sum(r[arm]["accepted"] for r in rows), sum(r[arm]["rounds"] for r in rows))

    return {
        "prompts": len(rows),
        "off": speedup("baseline", "off"),
        "on": speedup("baseline", "on"),
        "on_over_off": speedup("off", "on"),
        "mal_off": mal("off"),
        "mal_on": mal("on"),
        "identity": sum(r["on"]["ids"] == r["off"]["ids"] == r["baseline"]["ids"] for r in rows) / len(rows),
    }


def grouped(rows: list[dict]) -> dict:
    groups = {c: [r for r in rows if r["category"] == c] for c in dict.fromkeys(r["category"] for r in rows)}
    return {**{c: figures(rs) for c, rs in groups.items()}, "overall": figures(rows)}


def markdown(rep: dict) -> str:
    def x(s):
        return f"**{s[0]:.2f}x** ({s[1]:.2f}–{s[2]:.2f})"

    def num(v):
        return "n/a" if v is None else f"{v:.2f}"

    lines = [
        f"## Cross-request suffix cache, served ({rep['config']}, {rep['date']})",
        "",
        f"Greedy, streamed, 1 in flight, chat template, max_tokens {rep['max_tokens']}, draft-length policy "
        f"{rep['policy']}; one server, arms alternating per prompt after a one-token prefill: baseline (ensemble), "
        "off (BLS, no tenant), on (BLS, one tenant for the run).",
    ]
    for name, w in rep["workloads"].items():
        c = w["counters"]
        lines += [
            "",
            f"### {name}",
            "",
            "| group | prompts | off vs baseline | on vs baseline | on vs off | mean accepted off | on | identity |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for g, f in w["figures"].items():
            lines.append(
                f"| {g} | {f['prompts']} | {x(f['off'])} | {x(f['on'])} | {x(f['on_over_off'])} | {num(f['mal_off'])} "
                f"| {num(f['mal_on'])} | {f['identity']:.0%} |"
            )
        lines += [
            "",
            f"Server counters over this workload: {c['cache_rounds']:.0f} of {c['rounds']:.0f} rounds drew on the "
            f"cache, {c['cache_accepted']:.0f} draft tokens accepted in them; the cache holds {c['cache_tokens']:.0f} "
            "tokens at the end.",
        ]
    return "\n".join(lines)


def counters_delta(after: dict, before: dict) -> dict:
    return {k: (after[k] if k == "cache_tokens" else after[k] - before[k]) for k in after}


def run(a, server, manifest, out: Path) -> dict:
    from trt_spec.harness.client import LLMClient
    from trt_spec.harness.prompts import Prompt
    from trt_spec.in_triton.serving import load_tokenizer

    tok = load_tokenizer(manifest.engines["target"].dir)
    lim = manifest.limits
    room = lim.max_seq_len - manifest.speculative.max_draft_len
    items = code_edit_items(ROOT / a.code_edit, a.limit) if a.limit else []
    items = [{k: (replace(v, max_tokens=a.max_tokens) if k != "id" else v) for k, v in it.items()} for it in items]
    spec = spec_bench_prompts(a.per_category, tok, lim.max_input_len, room, a.max_tokens) if a.per_category else []
    client = LLMClient(server.grpc_url, "grpc")
    arms = Arms(client, tok, f"bench-{uuid.uuid4().hex[:8]}", a.policy)
    warm = Prompt("Say hello.", min(8, a.max_tokens), "warm-up")
    for arm in ARMS:
        arms.send(arm, warm, tenant="warm-up")
    rep: dict = {"workloads": {}}
    for name, fn, what in (("code-edit, repeated", code_edit_run, items), ("Spec-Bench", spec_bench_run, spec)):
        if not what:
            continue
        before = cache_counters(server)
        t0 = time.monotonic()
        rows = fn(arms, what)
        log(f"{name}: {len(rows)} measured prompts in {time.monotonic() - t0:.0f} s")
        rep["workloads"][name] = {
            "figures": grouped(rows),
            "counters": counters_delta(cache_counters(server), before),
            "rows": rows,
        }
    return rep


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default=CONFIG, help="the n-gram build config (built with `trt-spec build`)")
    ap.add_argument("--code-edit", default=CODE_EDIT, help="code-edit prompts (JSONL); held out: never tune on them")
    ap.add_argument("--limit", type=int, default=10, help="code-edit tasks (0: none)")
    ap.add_argument("--per-category", type=int, default=3, help="Spec-Bench questions per category (0: none)")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument(
        "--policy",
        choices=("adaptive", "fixed"),
        default=None,
        help="draft_len_policy of the off and on requests (default: the deployment's)",
    )
    ap.add_argument("--out", default="build/suffix_cache")
    a = ap.parse_args(argv)
    from trt_spec.serve.server import TritonServer, free_port

    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    config = ROOT / a.config
    repo, manifest = repository(config, out)
    server = TritonServer(
        repo, http_port=free_port(), grpc_port=free_port(), metrics_port=free_port(), log_path=out / "server.log"
    )
    try:
        server.start().wait_ready(600)
        rep = run(a, server, manifest, out)
    finally:
        server.stop()
    rep.update(
        config=a.config, max_tokens=a.max_tokens, policy=a.policy or "the deployment's", date=time.strftime("%F")
    )
    text = markdown(rep)
    (out / "suffix_cache.md").write_text(text + "\n")
    (out / "suffix_cache.json").write_text(json.dumps(rep, indent=2, default=float))
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
