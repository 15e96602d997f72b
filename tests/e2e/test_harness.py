"""The client harness against a real tritonserver: identity passes, a broken speculative model is caught at
the right position, bench reports every metric over HTTP and gRPC, errors are one clear line."""

from __future__ import annotations

import json
import sys
import time

import pytest

from trt_spec.harness.bench import paired_ab
from trt_spec.harness.client import LLMClient
from trt_spec.harness.identity import check_greedy, check_sampling, first_divergence
from trt_spec.harness.prompts import Prompt
from trt_spec.serve.server import free_port

from ..farm import cli, cli_in_process, tokenizer_dir

PROMPTS = [
    Prompt("def add(a, b):\n    return", 24),
    Prompt("The quick brown fox", 24),
    Prompt("for i in range(10):", 24),
]


def test_check_passes_over_both_protocols(dtm_server):
    for proto, url in (("grpc", dtm_server.grpc_url), ("http", dtm_server.http_url)):
        r = cli_in_process(
            "check",
            "--url",
            url,
            "--protocol",
            proto,
            "--prompts",
            "code",
            "--max-tokens",
            "16",
            "--limit",
            "2",
            "--tokenizer",
            tokenizer_dir(dtm_server.repo),
            "--format",
            "json",
        )
        assert r.returncode == 0, r.stderr
        rep = json.loads(r.stdout)
        assert rep["passed"] and rep["match_rate"] == 1.0 and rep["protocol"] == proto


def test_broken_speculative_model_is_caught_at_the_right_position(faulty_server):
    from trt_spec.in_triton.serving import load_tokenizer

    client = LLMClient(faulty_server.grpc_url, "grpc")
    tok = load_tokenizer(tokenizer_dir(faulty_server.repo))
    rep = check_greedy(client, PROMPTS, num_draft_tokens=3, tokenizer=tok)
    assert not rep.passed and rep.real_mismatches >= 1
    for p, res in zip(PROMPTS, rep.results):
        base = client.generate("ensemble", p.text, p.max_tokens, exclude_input_in_output=True)
        spec = client.generate(
            "tensorrt_llm_bls", p.text, p.max_tokens, exclude_input_in_output=True, num_draft_tokens=3
        )
        idx = first_divergence(base.output_ids, spec.output_ids)
        if idx is None:
            assert res.identical
            continue
        d = res.divergence
        assert (
            d.index == idx and d.baseline_token == base.output_ids[idx] and d.speculative_token == spec.output_ids[idx]
        )
        assert d.margin is not None and d.margin > 0.05 and d.kind == "mismatch"  # the engine returned logits
    r = cli_in_process(
        "check",
        "--url",
        faulty_server.http_url,
        "--protocol",
        "http",
        "--prompts",
        "code",
        "--max-tokens",
        "16",
        "--limit",
        "2",
        "--num-draft-tokens",
        "3",
    )
    assert r.returncode == 1 and "DIVERGED at token" in r.stdout and "verdict: FAIL" in r.stdout


def test_in_process_bench_runs_the_served_loop_round_for_round(dtm_server):
    """`bench in-process` drives the BLS's own loop over in-process engines: with the fixed policy (deterministic:
    no timing in its choices) and greedy decoding, it drafts, accepts and chooses k per round exactly as the served
    BLS did for the same prompts, and reports them in the same summary."""
    args = (
        "--prompts",
        "code",
        "--limit",
        "2",
        "--max-tokens",
        "16",
        "--k",
        "3",
        "--policy",
        "fixed",
        "--format",
        "json",
    )
    served = cli_in_process("bench", "served", "--url", dtm_server.grpc_url, *args)
    assert served.returncode == 0, served.stderr
    inproc = cli_in_process("bench", "in-process", str(dtm_server.repo.parent / "draft_target.yaml"), *args)
    assert inproc.returncode == 0, inproc.stderr
    s = json.loads(served.stdout)["bench"][0]["acceptance"]
    i = json.loads(inproc.stdout)["sweep"][0]["acceptance"]
    assert s["drafted"] > 0
    assert i == s


def test_bench_reports_every_metric_and_protocols_agree(dtm_server, tmp_path):
    reps = {}
    for proto, url in (("grpc", dtm_server.grpc_url), ("http", dtm_server.http_url)):
        # the fixed policy: the adaptive one decides from what the deployment measured so far (costs, acceptance, the
        # runs its requests reached), which the first protocol's run changes for the second
        reps[proto] = paired_ab(LLMClient(url, proto), PROMPTS[:2], k=3, warmup=0, policy="fixed")
    for rep in reps.values():
        for side in ("baseline", "speculative"):
            s = rep[side]
            assert s["tokens_per_s"] > 0 and s["ttft_s"]["p50"] > 0 and s["tpot_s"]["p50"] > 0
            assert s["latency_s"]["p50"] >= s["ttft_s"]["p50"]
        a = rep["acceptance"]
        assert a["drafted"] > 0 and len(a["histogram"]) == 4 and len(a["per_position_acceptance"]) == 3
        assert rep["speedup"] > 0 and rep["speedup_ci95"][0] <= rep["speedup"] <= rep["speedup_ci95"][1]
    # greedy, fixed k: both protocols see exactly the same drafting and acceptance
    assert reps["grpc"]["acceptance"] == reps["http"]["acceptance"]
    out = tmp_path / "rep"
    r = cli_in_process(
        "bench",
        "served",
        "--url",
        dtm_server.http_url,
        "--protocol",
        "http",
        "--prompts",
        "code",
        "--max-tokens",
        "12",
        "--limit",
        "2",
        "--k",
        "2",
        "--concurrency",
        "1",
        "--concurrency",
        "2",
        "--out",
        str(out),
    )
    assert r.returncode == 0, r.stderr
    assert "## Speedup (http, k=2)" in r.stdout and "## Concurrency sweep" in r.stdout
    assert (
        "| in flight | model | requests | total tok/s | TPOT p50 (ms) | latency p50 (s) | latency p99 (s) | "
        "TTFT p50 (ms) | speedup | acceptance rate | mean acceptance length |"
    ) in r.stdout
    assert r.stdout.count("| ensemble |") == 2 and r.stdout.count("| tensorrt_llm_bls |") == 2
    rep = json.loads((out / "report.json").read_text())
    # every raw sample is kept: one baseline and one speculative request per prompt
    assert sorted((s["model"], s["prompt"]) for s in rep["bench"][0]["samples"]) == [
        ("ensemble", 0),
        ("ensemble", 1),
        ("tensorrt_llm_bls", 0),
        ("tensorrt_llm_bls", 1),
    ]
    assert [r["concurrency"] for r in rep["concurrency"]] == [1, 2]
    for row in rep["concurrency"]:
        for model in ("ensemble", "tensorrt_llm_bls"):
            side = row[model]
            # per level and model: every request's raw sample, total tok/s over the level's wall time
            assert sorted(s["prompt"] for s in side["samples"]) == [0, 1] and side["requests"] == 2
            assert side["tokens_per_s"] == pytest.approx(side["tokens"] / side["wall_s"])
            assert side["latency_s"]["p99"] >= side["latency_s"]["p50"] >= side["ttft_s"]["p50"] > 0
            assert side["tpot_s"]["p50"] > 0
        spec, base = row["tensorrt_llm_bls"], row["ensemble"]
        assert row["speedup"] == pytest.approx(spec["tokens_per_s"] / base["tokens_per_s"])
        acc = row["acceptance"]
        assert acc["drafted"] == sum(s["drafted"] for s in spec["samples"]) > 0
        assert acc["acceptance_rate"] == pytest.approx(acc["accepted"] / acc["drafted"])
    assert rep["environment"]["python"] == sys.version.split()[0]  # the CLI ran under this interpreter
    for png in (
        "tokens_per_s.png",
        "acceptance_histogram.png",
        "speedup_vs_concurrency.png",
        "throughput_vs_concurrency.png",
    ):
        assert (out / png).stat().st_size > 1000


def test_tune_recommends_a_k(ngram_server, tmp_path):
    r = cli_in_process(
        "tune",
        "--url",
        ngram_server.grpc_url,
        "--prompts",
        "code",
        "--max-tokens",
        "16",
        "--limit",
        "2",
        "--k",
        "1",
        "--k",
        "4",
        "--out",
        str(tmp_path),
    )
    assert r.returncode == 0, r.stderr
    assert "Recommended num_draft_tokens" in r.stdout and (tmp_path / "speedup_vs_k.png").is_file()


def test_sampling_distribution_check(ngram_server):
    client = LLMClient(ngram_server.grpc_url, "grpc")
    rep = check_greedy(client, PROMPTS[:1])
    check_sampling(client, PROMPTS[:1], rep, temperature=1.0, samples=120)
    d = rep.distribution[0]
    assert d["samples"] == 120 and d["dof"] >= 1  # sampled, not greedy: two or more outcome classes
    assert d["passed"], d


def test_errors_are_one_clear_line(dtm_server):
    r = cli("check", "--url", f"127.0.0.1:{free_port()}", "--protocol", "http")
    assert r.returncode == 2 and r.stderr.strip().startswith("error: no Triton server ready")
    assert len(r.stderr.strip().splitlines()) == 1
    r = cli("bench", "served", "--url", f"127.0.0.1:{free_port()}")
    assert r.returncode == 2 and r.stderr.strip().startswith("error: no Triton server ready")


@pytest.mark.parametrize(
    "port,protocol,words",
    [
        ("grpc", "http", "is a gRPC port (it answered HTTP/2), not HTTP: drop `--protocol http`"),
        ("http", "grpc", "is an HTTP port (it answered HTTP/1.1), not gRPC: add `--protocol http`"),
        ("metrics", "http", "answers HTTP but is not Triton's HTTP API (its metrics port?)"),
    ],
)
def test_the_wrong_port_or_protocol_is_named_with_the_fix(dtm_server, port, protocol, words):
    """A server is there, on another protocol: one line saying so and what to change (it was a traceback, or
    "start one with trt-spec serve" although a server was running), at once rather than after a wait."""
    url = {"grpc": dtm_server.grpc_url, "http": dtm_server.http_url, "metrics": f"127.0.0.1:{dtm_server.metrics_port}"}[
        port
    ]
    for cmd in (("check",), ("bench", "served"), ("tune",)):
        t0 = time.perf_counter()
        r = cli(*cmd, "--url", url, "--protocol", protocol, "--limit", "1")
        errors = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
        assert r.returncode == 2 and len(errors) == 1 and errors[0].startswith(f"error: {url} {words}"), r.stderr
        assert "Traceback" not in r.stderr and time.perf_counter() - t0 < 20


def test_wait_lets_check_start_before_the_server(tmp_path):
    """--wait: nothing listens yet, the command waits; without it, the one line names --wait."""
    port = free_port()
    t0 = time.perf_counter()
    r = cli("check", "--url", f"127.0.0.1:{port}", "--wait", "2")
    assert r.returncode == 2 and time.perf_counter() - t0 >= 2
    assert r.stderr.strip() == (
        f"error: no Triton server ready at 127.0.0.1:{port} (grpc): nothing listens there; "
        "start one with `trt-spec serve REPO`, or pass --wait SECONDS for one that is starting"
    )
