"""`trt-spec serve REPO --openai-port P` as a user runs it, reached with the official `openai` SDK and AIPerf: the
OpenAI API over the real tritonserver, its answers identical to the KServe ones, its errors OpenAI's."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest

openai = pytest.importorskip("openai")

from trt_spec.harness.client import GREEDY, LLMClient  # noqa: E402
from trt_spec.records.names import BASELINE, SPECULATIVE, TARGET  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
PROMPT = "def add(a, b):\n    return"


@pytest.fixture(scope="module")
def openai_server(farm, ngram_server):
    """The farm's n-gram deployment (its tokenizer has a chat template) with the OpenAI frontend `trt-spec serve
    --openai-port` starts in front of it."""
    fe = farm.openai("ngram")
    ns = type("Served", (), {})()
    ns.url, ns.grpc, ns.repo, ns.log, ns.client = fe.url, ngram_server.grpc_url, ngram_server.repo, fe.log, fe.client
    ns.tokenizer_dir = str(farm.models()["chat_target"])
    ns.triton_metrics = f"http://127.0.0.1:{ngram_server.metrics_port}/metrics"
    return ns


def kserve_greedy(s, model: str, prompt: str, n: int) -> str:
    return LLMClient(s.grpc, "grpc").generate(model, prompt, n, **GREEDY).text


def test_models_and_greedy_completions_equal_the_kserve_answers(openai_server):
    s = openai_server
    assert [m.id for m in s.client.models.list().data] == [BASELINE, SPECULATIVE]
    want = kserve_greedy(s, BASELINE, PROMPT, 24)
    for model in (BASELINE, SPECULATIVE):
        r = s.client.completions.create(model=model, prompt=PROMPT, max_tokens=24, temperature=0)
        assert r.object == "text_completion" and r.model == model
        assert r.choices[0].text == want, model  # speculation changes nothing, through this API too
        assert r.choices[0].finish_reason in ("length", "stop")
        assert r.usage.prompt_tokens > 0 and 0 < r.usage.completion_tokens <= 24
        assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_streaming_matches_and_ends_with_usage_and_done(openai_server):
    s = openai_server
    whole = s.client.completions.create(model=SPECULATIVE, prompt=PROMPT, max_tokens=24, temperature=0)
    chunks = list(
        s.client.completions.create(
            model=SPECULATIVE,
            prompt=PROMPT,
            max_tokens=24,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole.choices[0].text
    assert len([c for c in chunks if c.choices and c.choices[0].text]) > 1  # it streamed
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    # the raw stream: server-sent events ending with [DONE]
    req = urllib.request.Request(
        s.url + "/v1/completions",
        method="POST",
        headers={"Content-Type": "application/json"},
        data=json.dumps({"model": BASELINE, "prompt": PROMPT, "max_tokens": 4, "stream": True}).encode(),
    )
    with urllib.request.urlopen(req, timeout=60) as resp:
        assert resp.headers["Content-Type"].startswith("text/event-stream")
        events = [ln for ln in resp.read().decode().split("\n\n") if ln]
    assert events[-1] == "data: [DONE]" and all(e.startswith("data: ") for e in events)


def test_chat_uses_the_chat_template_streaming_or_not(openai_server):
    from transformers import AutoTokenizer

    s = openai_server
    messages = [{"role": "system", "content": "You write Python."}, {"role": "user", "content": "Add two numbers."}]
    templated = AutoTokenizer.from_pretrained(s.tokenizer_dir).apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True
    )
    want = kserve_greedy(s, SPECULATIVE, templated, 16)
    r = s.client.chat.completions.create(model=SPECULATIVE, messages=messages, max_completion_tokens=16, temperature=0)
    assert r.object == "chat.completion" and r.choices[0].message.role == "assistant"
    assert r.choices[0].message.content == want
    chunks = list(
        s.client.chat.completions.create(
            model=SPECULATIVE, messages=messages, max_tokens=16, temperature=0, stream=True
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == want
    assert chunks[-1].choices[0].finish_reason in ("length", "stop")


def test_stop_strings_end_the_text_before_them(openai_server):
    s = openai_server
    full = s.client.completions.create(model=BASELINE, prompt=PROMPT, max_tokens=24, temperature=0).choices[0].text
    stop = full[6:9]
    assert stop.strip(), full
    for model in (BASELINE, SPECULATIVE):
        for stream in (False, True):
            if stream:
                text = "".join(
                    c.choices[0].text
                    for c in s.client.completions.create(
                        model=model, prompt=PROMPT, max_tokens=24, temperature=0, stop=[stop], stream=True
                    )
                    if c.choices
                )
            else:
                r = s.client.completions.create(model=model, prompt=PROMPT, max_tokens=24, temperature=0, stop=stop)
                text = r.choices[0].text
                assert r.choices[0].finish_reason == "stop"
            assert text == full[: full.index(stop)], (model, stream)


def test_sampling_is_seeded_and_speculation_knobs_go_in_the_body(openai_server):
    s = openai_server
    kw = dict(model=SPECULATIVE, prompt=PROMPT, max_tokens=16, temperature=1.0, top_p=0.9)
    a = s.client.completions.create(seed=7, **kw).choices[0].text
    assert a == s.client.completions.create(seed=7, **kw).choices[0].text
    r = s.client.completions.create(
        model=SPECULATIVE,
        prompt=PROMPT,
        max_tokens=16,
        temperature=0,
        extra_body={"num_draft_tokens": 2, "draft_len_policy": "fixed"},
    )
    assert r.choices[0].text == kserve_greedy(s, BASELINE, PROMPT, 16)


@pytest.mark.parametrize(
    "kw,status,words",
    [
        (dict(model="gpt-4"), 404, "does not exist"),
        (dict(n=2), 400, "'n' must be 1"),
        (dict(temperature=3), 400, "'temperature' must be in"),
        (dict(max_tokens=100000), 400, "ask for at most"),
        (dict(model=BASELINE, extra_body={"num_draft_tokens": 2}), 400, "applies to the speculative model"),
        (dict(extra_body={"draft_len_policy": "greedy"}), 400, "must be one of adaptive, fixed"),
        (dict(logprobs=2), 400, "'logprobs' is not supported"),
    ],
)
def test_bad_requests_get_openai_errors_and_the_server_stays_up(openai_server, kw, status, words):
    s = openai_server
    args = {"model": SPECULATIVE, "prompt": PROMPT, "max_tokens": 4, **kw}
    with pytest.raises(openai.APIStatusError) as e:
        s.client.completions.create(**args)
    assert e.value.status_code == status
    err = e.value.body  # the SDK's parsed "error" object
    assert words in err["message"] and err["type"] == "invalid_request_error"
    assert s.client.completions.create(model=SPECULATIVE, prompt=PROMPT, max_tokens=2, temperature=0).choices


def _target_requests(s) -> int:
    import tritonclient.grpc as grpcclient

    stats = grpcclient.InferenceServerClient(s.grpc).get_inference_statistics(TARGET, as_json=True)
    return int(stats["model_stats"][0]["inference_stats"]["success"].get("count", 0))


def test_a_cancelled_stream_stops_its_work(openai_server):
    """A client that closes its stream after the first chunk: the BLS stops sending engine calls (the gRPC call is
    cancelled, Triton cancels the request, the loop stops between rounds)."""
    s = openai_server
    # k = 0 under the fixed policy: one target call per token (the adaptive policy may decode a run in one call, which
    # leaves too few calls to tell a stopped request from a finished one on a loaded machine)
    body = {"num_draft_tokens": 0, "draft_len_policy": "fixed"}
    kw = dict(model=SPECULATIVE, prompt=PROMPT, max_tokens=300, temperature=0, extra_body=body)
    before = _target_requests(s)
    s.client.completions.create(**kw)
    full = _target_requests(s) - before
    before = _target_requests(s)
    stream = s.client.completions.create(stream=True, **kw)
    next(iter(stream))
    stream.close()
    time.sleep(2.0)
    cancelled = _target_requests(s) - before
    assert full >= 20 and cancelled < full / 2, (cancelled, full)
    time.sleep(1.0)
    assert _target_requests(s) - before == cancelled  # nothing more runs for it
    metrics = urllib.request.urlopen(s.url + "/metrics", timeout=10).read().decode()
    assert f'vllm:num_requests_running{{engine="0",model_name="{SPECULATIVE}"}} 0.0' in metrics


REPEATING = "def add(a, b):\n    return a + b\n\ndef add(a, b):\n    return"  # n-gram mode drafts from it


def server_acceptance(s) -> dict:
    """The speculative model's counts on Triton's metrics port (the BLS's counters, spec_metrics.py): accepted and
    drafted tokens, drafts (vLLM's: rounds that drafted), and the accepted-length histogram per value 0..k."""
    from trt_spec.in_triton.spec_metrics import histogram, scrape, value
    from trt_spec.records import names as n

    m = scrape(s.triton_metrics)
    vllm = {"model_name": SPECULATIVE, "engine": "0"}
    cum = [c for le, c in histogram(m, n.METRIC_ACCEPTED_LENGTH, model=SPECULATIVE).items() if le != float("inf")]
    return {
        "accepted": int(value(m, n.VLLM_NUM_ACCEPTED_TOKENS, **vllm)),
        "drafted": int(value(m, n.VLLM_NUM_DRAFT_TOKENS, **vllm)),
        "steps": int(value(m, n.VLLM_NUM_DRAFTS, **vllm)),
        "hist": [int(c - (cum[i - 1] if i else 0)) for i, c in enumerate(cum)],
    }


def acceptance_delta(before: dict, after: dict) -> dict:
    return {
        **{k: after[k] - before[k] for k in ("accepted", "drafted", "steps")},
        "hist": [a - b for a, b in zip(after["hist"], before["hist"])],
    }


def check_vllm_shape(spec: dict, counted: dict) -> None:
    """vLLM's metrics.speculative_decoding (serve/openai/metrics.py), equal to what the server counted."""
    hist = spec["acceptance_histogram"]
    assert spec["num_spec_tokens"] == len(hist) - 1 and spec["num_spec_steps"] == sum(hist)
    assert spec["num_accepted_draft_tokens"] == sum(j * c for j, c in enumerate(hist))
    assert spec["mean_acceptance_length"] == pytest.approx(1 + spec["num_accepted_draft_tokens"] / sum(hist))
    assert spec["draft_acceptance_rate"] == pytest.approx(spec["num_accepted_draft_tokens"] / spec["num_draft_tokens"])
    assert (spec["num_accepted_draft_tokens"], spec["num_draft_tokens"], spec["num_spec_steps"]) == (
        counted["accepted"],
        counted["drafted"],
        counted["steps"],
    )
    assert hist + [0] * (len(counted["hist"]) - len(hist)) == counted["hist"]


def test_responses_carry_vllms_per_request_acceptance_equal_to_the_servers_counts(openai_server):
    """metrics.speculative_decoding (vLLM's shape) on the whole body and on the include_usage chunk, equal to the
    Prometheus counters' delta over the request and to the BLS's own outputs over KServe; none for the baseline."""
    s = openai_server
    kw = dict(prompt=REPEATING, max_tokens=24, temperature=0, extra_body={"draft_len_policy": "fixed"})
    before = server_acceptance(s)
    body = s.client.completions.create(model=SPECULATIVE, **kw).model_dump()
    counted = acceptance_delta(before, server_acceptance(s))
    spec = body["metrics"]["speculative_decoding"]
    check_vllm_shape(spec, counted)
    assert spec["num_draft_tokens"] > 0 and spec["num_spec_steps"] > 0
    # over KServe the BLS's own outputs equal the counters' delta too (its own request: proposal lengths learn from
    # every request, so two requests' counts need not be equal)
    before = server_acceptance(s)
    kserve = LLMClient(s.grpc, "grpc").generate(SPECULATIVE, REPEATING, 24, draft_len_policy="fixed", **GREEDY).metrics
    counted = acceptance_delta(before, server_acceptance(s))
    assert (kserve["total_accepted_draft_tokens"], kserve["total_draft_tokens"]) == (
        counted["accepted"],
        counted["drafted"],
    )
    hist = [int(x) for x in np.asarray(kserve["accepted_length_histogram"]).reshape(-1)]
    assert hist + [0] * (len(counted["hist"]) - len(hist)) == counted["hist"]
    # streamed chat: only the trailing usage chunk carries it, as vLLM sends it
    before = server_acceptance(s)
    chunks = [
        c.model_dump()
        for c in s.client.chat.completions.create(
            model=SPECULATIVE,
            messages=[{"role": "user", "content": REPEATING}],
            max_tokens=24,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    ]
    counted = acceptance_delta(before, server_acceptance(s))
    assert [c.get("metrics") is not None for c in chunks] == [False] * (len(chunks) - 1) + [True]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] > 0
    check_vllm_shape(chunks[-1]["metrics"]["speculative_decoding"], counted)
    # the baseline does not speculate: its body is unchanged (vLLM without speculation)
    base = s.client.completions.create(model=BASELINE, **{**kw, "extra_body": None}).model_dump()
    assert "metrics" not in base or base["metrics"] is None
    streamed = list(
        s.client.completions.create(
            model=BASELINE, stream=True, stream_options={"include_usage": True}, **{**kw, "extra_body": None}
        )
    )
    assert all(c.model_dump().get("metrics") is None for c in streamed)


@pytest.mark.slow
def test_aiperf_profiles_the_chat_endpoint_without_errors(openai_server, tmp_path):
    s = openai_server
    aiperf = shutil.which("aiperf") or str(Path(sys.executable).with_name("aiperf"))
    out = tmp_path / "aiperf"
    # A local tokenizer directory: AIPerf 0.13 loads it by path when HF offline mode is NOT set (with HF_HUB_OFFLINE it
    # looks the name up in the hub cache only, aiperf/common/tokenizer.py _from_pretrained_local); nothing is fetched.
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    p = subprocess.run(
        [
            aiperf,
            "profile",
            "--model",
            SPECULATIVE,
            "--url",
            s.url,
            "--endpoint-type",
            "chat",
            "--streaming",
            "--request-count",
            "8",
            "--concurrency",
            "2",
            "--isl",
            "24",
            "--osl",
            "12",
            "--tokenizer",
            s.tokenizer_dir,
            "--artifact-dir",
            str(out),
            "--ui",
            "none",
            "--extra-inputs",
            "temperature:0",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    rep = json.loads((out / "profile_export_aiperf.json").read_text())
    assert rep["request_count"]["avg"] == 8, sorted(rep)
    assert rep["time_to_first_token"]["avg"] > 0 and rep["inter_token_latency"]["avg"] > 0
    assert rep.get("error_request_count", {}).get("avg", 0) == 0, rep.get("error_request_count")


def test_bench_openai_client_reads_any_servers_acceptance(openai_server):
    """bench openai's client over trt-spec's frontend as "any server": the acceptance it reads from the responses is
    the server's count; a model whose responses carry none (the baseline in the speculative role) is "not
    reported", its rates None, never 0."""
    from trt_spec.harness.bench import RequestSample, request_acceptance_counts
    from trt_spec.harness.openai_client import FROM_RESPONSES, NOT_REPORTED, OpenAIClient, endpoints
    from trt_spec.records.speculation import acceptance_summary

    s = openai_server
    for api in ("completions", "chat"):
        c = OpenAIClient(endpoints((s.url,), ()), api=api)
        before = server_acceptance(s)
        g = c.generate(SPECULATIVE, REPEATING, 24, draft_len_policy="fixed")
        counted = acceptance_delta(before, server_acceptance(s))
        acc = acceptance_summary(request_acceptance_counts([RequestSample.of(SPECULATIVE, 0, 0, g)]))
        assert acc["source"] == FROM_RESPONSES and counted["drafted"] > 0, (acc, counted)
        assert (acc["accepted"], acc["drafted"], acc["speculative_rounds"]) == (
            counted["accepted"],
            counted["drafted"],
            counted["steps"],
        )
        assert acc["acceptance_rate"] == pytest.approx(counted["accepted"] / counted["drafted"])
        assert acc["mean_acceptance_length"] == pytest.approx(1 + counted["accepted"] / counted["steps"])
        assert acc["histogram"] + [0] * (len(counted["hist"]) - len(acc["histogram"])) == counted["hist"]
        c.close()
    silent = OpenAIClient(endpoints((s.url,), (SPECULATIVE, BASELINE)))  # the ensemble as "the speculative server"
    g = silent.generate(SPECULATIVE, PROMPT, 8)
    acc = acceptance_summary(request_acceptance_counts([RequestSample.of(SPECULATIVE, 0, 0, g)]))
    assert acc["source"] == NOT_REPORTED and acc["acceptance_rate"] is None and acc["mean_acceptance_length"] is None
    silent.close()


@pytest.mark.slow  # AIPerf's run (~15 s): `make slow`, which CI runs
def test_aiperf_spec_decode_section_shows_the_servers_acceptance(openai_server, tmp_path):
    """`aiperf profile` (0.13) against the OpenAI port: its Spec Decode metrics, read back from its JSON export, equal
    what the server counted over the run (the BLS's counters on Triton's metrics port)."""
    s = openai_server
    aiperf = shutil.which("aiperf") or str(Path(sys.executable).with_name("aiperf"))
    out = tmp_path / "aiperf"
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}  # see above
    prompts = tmp_path / "prompts.jsonl"  # repeating code: n-gram mode drafts from it and gets some accepted
    prompts.write_text("".join(json.dumps({"text": REPEATING.replace("add", name)}) + "\n" for name in "abcdef"))
    before = server_acceptance(s)
    p = subprocess.run(
        [
            aiperf,
            "profile",
            "--model",
            SPECULATIVE,
            "--url",
            s.url,
            "--endpoint-type",
            "completions",
            "--streaming",
            "--request-count",
            "6",
            "--concurrency",
            "2",
            "--input-file",
            str(prompts),
            "--custom-dataset-type",
            "single_turn",
            "--tokenizer",
            s.tokenizer_dir,
            "--artifact-dir",
            str(out),
            "--ui",
            "none",
            "--extra-inputs",
            "temperature:0",
            "--extra-inputs",
            "max_tokens:24",
            "--extra-inputs",  # drafts on any machine: the adaptive policy may have learned they do not pay here
            "draft_len_policy:fixed",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    counted = acceptance_delta(before, server_acceptance(s))
    rep = json.loads((out / "profile_export_aiperf.json").read_text())
    assert rep["request_count"]["avg"] == 6 and rep.get("error_request_count", {}).get("avg", 0) == 0
    # drafts were made and some accepted (how many depends on what this server's suffix cache saw before)
    assert counted["accepted"] > 0 and counted["drafted"] >= counted["accepted"], counted
    assert rep["total_accepted_draft_tokens"]["avg"] == counted["accepted"], rep["total_accepted_draft_tokens"]
    assert rep["total_draft_tokens"]["avg"] == counted["drafted"]
    assert rep["total_spec_decode_steps"]["avg"] == counted["steps"]
    pooled = {int(j): c for j, c in rep["pooled_spec_decode_acceptance_histogram"].items()}
    assert pooled == {j: c for j, c in enumerate(counted["hist"]) if c}
    assert rep["spec_decode_overall_draft_acceptance_rate"]["avg"] == pytest.approx(
        100 * counted["accepted"] / counted["drafted"]
    )
    assert "Spec Decode" in p.stdout and "Acceptance Length" in p.stdout


def cli(*args, timeout=600):
    return subprocess.run(
        [sys.executable, "-m", "trt_spec.cli", *args], capture_output=True, text=True, timeout=timeout, cwd=ROOT
    )


@pytest.mark.slow
def test_bench_openai_paired_request_rate_and_a_sharegpt_file(openai_server, tmp_path):
    """`bench openai --url URL`: the paired A/B and the Poisson request-rate run with goodput, on prompts from a
    ShareGPT-style file, with the served bench's report; two servers given as two URLs work the same."""
    s = openai_server
    data = tmp_path / "sharegpt.json"
    data.write_text(
        json.dumps(
            [
                {"conversations": [{"from": "human", "value": p}, {"from": "gpt", "value": "x" * 40}]}
                for p in ("def add(a, b):", "The quick brown fox", "for i in range(10):")
            ]
        )
    )
    out = tmp_path / "rep"
    r = cli(
        "bench",
        "openai",
        "--url",
        s.url,
        "--prompts",
        str(data),
        "--request-rate",
        "4",
        "--num-requests",
        "4",
        "--slo-ttft-ms",
        "60000",
        "--out",
        str(out),
        "--format",
        "json",
    )
    assert r.returncode == 0, r.stderr[-3000:]
    rep = json.loads(r.stdout)
    (ab,) = rep["bench"]
    assert ab["protocol"] == "openai chat" and ab["requests"] == 3 and ab["speedup"] > 0
    assert ab["baseline"]["tokens"] > 0 and ab["speculative"]["ttft_s"]["p50"] > 0
    assert ab["acceptance"]["source"].startswith("the server's responses")  # metrics.speculative_decoding
    rate = rep["rate"]
    assert rate["request_rate"] == 4 and rate["requests"] == 4
    assert rate["tensorrt_llm_bls"]["slo_met"] == 4 and rate["tensorrt_llm_bls"]["goodput_rps"] > 0
    md = (out / "report.md").read_text()
    assert "## Request rate 4/s (Poisson arrivals, 4 requests per model)" in md and "goodput ratio" in md
    two = cli(
        "bench",
        "openai",
        "--url",
        s.url,
        "--url",
        s.url + "/v1",
        "--model",
        BASELINE,
        "--model",
        SPECULATIVE,
        "--api",
        "completions",
        "--prompts",
        str(data),
        "--limit",
        "1",
        "--format",
        "json",
    )
    assert two.returncode == 0, two.stderr[-3000:]
    assert json.loads(two.stdout)["bench"][0]["protocol"] == "openai completions"
    bad = cli("bench", "openai", "--url", s.url, "--model", "a", "--model", "b", "--limit", "1")
    assert bad.returncode == 2 and "model 'a' is not served at" in bad.stderr and "Traceback" not in bad.stderr


def test_every_metric_the_grafana_dashboard_reads_is_served(openai_server):
    """After the requests above: each metric the shipped dashboard queries is on Triton's metrics port or the
    frontend's /metrics (the HPA ratio is recorded by Prometheus from Triton's two counters, which are served)."""
    import re

    from trt_spec.deploy.k8s import CHART_SOURCES, QUEUE_COMPUTE_RULE
    from trt_spec.in_triton.spec_metrics import parse_metrics
    from trt_spec.records.defaults import QUEUE_COMPUTE_METRIC

    s = openai_server
    served = {
        x.name
        for url in (s.triton_metrics, s.url + "/metrics")
        for x in parse_metrics(urllib.request.urlopen(url, timeout=10).read().decode())
    }
    dash = json.loads((CHART_SOURCES / "dashboards" / "trt-spec.json").read_text())
    for expr in (t["expr"] for p in dash["panels"] for t in p["targets"]):
        for name in re.findall(r"(?<![\w:$])([a-zA-Z_][a-zA-Z0-9_]*:[a-zA-Z0-9_:]+|trt_spec_[a-z_]+)", expr):
            if name == QUEUE_COMPUTE_METRIC:
                assert all(src in served for src in re.findall(r"nv_inference_\w+", QUEUE_COMPUTE_RULE))
            else:
                assert name in served, (name, sorted(x for x in served if ":" in x or x.startswith("trt_spec")))
