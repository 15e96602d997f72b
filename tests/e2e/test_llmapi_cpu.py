"""The CPU `runtime: llmapi` deployment on the real tritonserver: the stand-in of TensorRT-LLM's LLM-API model answers
NVIDIA's documented request as 1.2.1 does (zero speculative perf outputs, the whole text so far in each streamed
response), speculates inside the model (n-gram, no BLS), and the baseline is loaded for its phase only: the launch
loads the speculative model alone, check and bench switch to the baseline and back (harness/phases.py), and its text
equals the speculative model's."""

from __future__ import annotations

import json
import urllib.request

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import yaml

from trt_spec.records import llmapi_contract as lc

PROMPT = "def add(a, b):\n    return a + b\n\ndef add(a, b):\n    return"


def generate(server, model: str, body: dict) -> dict:
    """NVIDIA's documented request: POST /v2/models/tensorrt_llm/generate with text_input and sampling_param_*."""
    req = urllib.request.Request(
        f"http://{server.http_url}/v2/models/{model}/generate",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return json.loads(r.read())
    except urllib.error.HTTPError as e:
        return {"status": e.code, **json.loads(e.read() or b"{}")}


def ready(server, model: str) -> bool:
    try:
        with urllib.request.urlopen(f"http://{server.http_url}/v2/models/{model}/ready", timeout=10) as r:
            return r.status == 200
    except urllib.error.URLError:
        return False


def test_nvidias_documented_request_and_only_the_speculative_model_loaded(llmapi_server):
    body = {"text_input": PROMPT, "sampling_param_max_tokens": 24}
    spec = generate(llmapi_server, "tensorrt_llm", body)
    assert spec["text_output"].startswith(PROMPT)  # exclude_input_from_output defaults to False, as NVIDIA's model
    assert len(spec["text_output"]) > len(PROMPT)
    # the baseline, a second full copy of the target, is not loaded beside it (loaded for its phase only)
    assert ready(llmapi_server, "tensorrt_llm") and not ready(llmapi_server, "tensorrt_llm_baseline")
    only = generate(
        llmapi_server,
        "tensorrt_llm",
        {
            **body,
            "sampling_param_exclude_input_from_output": True,
            "sampling_param_return_perf_metrics": True,
            "return_finish_reason": True,
        },
    )
    assert PROMPT + only["text_output"] == spec["text_output"]
    # the perf outputs are strings, as NVIDIA's model writes them; 1.2.1's PyTorch flow answers 0 for the speculative
    # ones even though n-gram speculation drafted on this prompt (NVIDIA/TensorRT-LLM#17082)
    assert (only["total_draft_tokens"], only["total_accepted_draft_tokens"], only["acceptance_rate"]) == (
        "0",
        "0",
        "0.0",
    )
    assert only["finish_reason"] in ("length", "stop")


def test_streaming_over_grpc_concatenates_to_the_completion(llmapi_server):
    whole = generate(
        llmapi_server,
        "tensorrt_llm",
        {"text_input": PROMPT, "sampling_param_max_tokens": 24, "sampling_param_exclude_input_from_output": True},
    )["text_output"]
    c = grpcclient.InferenceServerClient(llmapi_server.grpc_url)
    got = []
    c.start_stream(callback=lambda result, error: got.append((result, error)))
    ins = []
    for name, value, dtype in (
        ("text_input", PROMPT.encode(), "BYTES"),
        ("streaming", True, "BOOL"),
        ("sampling_param_max_tokens", 24, "INT32"),
    ):
        arr = np.array([value], dtype=object if dtype == "BYTES" else (bool if dtype == "BOOL" else np.int32))
        t = grpcclient.InferInput(name, [1], dtype)
        t.set_data_from_numpy(arr)
        ins.append(t)
    c.async_stream_infer("tensorrt_llm", ins, enable_empty_final_response=True)
    import time

    deadline = time.time() + 60
    while time.time() < deadline and not any(
        r is not None and r.get_response().parameters["triton_final_response"].bool_param for r, _ in got
    ):
        time.sleep(0.05)
    c.stop_stream()
    assert all(e is None for _, e in got)
    chunks = [r.as_numpy("text_output") for r, _ in got if r is not None and r.as_numpy("text_output") is not None]
    texts = ["".join(x.decode() for x in a.reshape(-1)) for a in chunks]
    # each response is one iteration with the whole text so far (NVIDIA's model sends CompletionOutput.text)
    assert texts[-1] == PROMPT + whole and len(texts) > 1  # exclude_input_from_output defaults to False
    assert all(b.startswith(a) for a, b in zip(texts, texts[1:]))


def test_stop_strings_and_refusals_in_the_models_words(llmapi_server):
    """NVIDIA's model hands sampling_param_stop to SamplingParams undecoded, and the tokenizer refuses bytes
    (lc.STOP_INPUT): the stand-in fails it as the model does, in the model's words; so does an impossible length."""
    stopped = generate(
        llmapi_server,
        "tensorrt_llm",
        {"text_input": PROMPT, "sampling_param_max_tokens": 24, "sampling_param_stop": ["return"]},
    )
    assert stopped["status"] == 400 and stopped["error"] == lc.GENERATION_ERROR.format(msg=lc.STOP_REFUSED)
    bad = generate(llmapi_server, "tensorrt_llm", {"text_input": PROMPT, "sampling_param_max_tokens": 100000})
    assert bad["status"] == 400 and bad["error"].startswith("Error generating request: ")


@pytest.mark.slow  # a minute: check + bench's three phases over HTTP; make slow (CI) runs it
def test_check_and_bench_against_the_llmapi_models(llmapi_server, tmp_path):
    """The harness maps its baseline and speculative roles onto tensorrt_llm_baseline and tensorrt_llm (the LLM-API
    path has no ensemble), counts tokens with the target's tokenizer, measures the speculative model, then the
    baseline in its own phase (switched with the admin key `trt-spec serve` leaves on this host), and puts the
    speculative model back; identity holds and acceptance comes from the streamed responses."""
    import subprocess
    import sys

    from trt_spec.harness.bench import paired_ab
    from trt_spec.harness.client import ClientError, LLMClient
    from trt_spec.harness.prompts import Prompt
    from trt_spec.in_triton.serving import load_tokenizer
    from trt_spec.records.names import TEXT_MODELS

    tok_dir = str(next((llmapi_server.repo.parent / "build" / "engines").glob("target")))
    bare = LLMClient(llmapi_server.grpc_url, "grpc")
    bare.check_ready(list(TEXT_MODELS))
    assert bare.names == {"ensemble": "tensorrt_llm_baseline", "tensorrt_llm_bls": "tensorrt_llm"} and bare.phased
    with pytest.raises(ClientError, match="returns text only: pass --tokenizer"):
        bare.generate("tensorrt_llm_bls", PROMPT, 8)
    for proto, url in (("grpc", llmapi_server.grpc_url), ("http", llmapi_server.http_url)):
        r = subprocess.run(
            [
                sys.executable,
                "-m",
                "trt_spec.cli",
                "check",
                "--url",
                url,
                "--protocol",
                proto,
                "--prompts",
                "code-edit",
                "--limit",
                "2",
                "--max-tokens",
                "16",
                "--tokenizer",
                tok_dir,
                "--raw",
                "--format",
                "json",
            ],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert r.returncode == 0, r.stderr[-2000:]
        rep = json.loads(r.stdout)
        assert rep["passed"] and rep["match_rate"] == 1.0 and rep["order"].startswith("phased")
        assert all(x["baseline_tokens"] > 0 for x in rep["results"]), rep
        assert ready(llmapi_server, "tensorrt_llm") and not ready(llmapi_server, "tensorrt_llm_baseline")
    c = LLMClient(llmapi_server.grpc_url, "grpc").use_tokenizer(load_tokenizer(tok_dir))
    c.check_ready(list(TEXT_MODELS))
    res = paired_ab(c, [Prompt(PROMPT, 24)], warmup=0)
    assert res["speedup"] > 0 and res["speculative"]["tokens"] == res["baseline"]["tokens"] > 0
    # the model's own counts are 0 (1.2.1): acceptance from the streamed responses, n-gram accepted on this prompt
    acc = res["acceptance"]
    assert acc["drafted"] == 0 and acc["acceptance_rate"] is None and acc["source"] == lc.FROM_STREAMED_CHUNKS
    assert acc["mean_acceptance_length"] > 1.0 and res["order"].startswith("phased")
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "trt_spec.cli",
            "bench",
            "served",
            "--url",
            llmapi_server.grpc_url,
            "--tokenizer",
            tok_dir,
            "--prompts",
            "code-edit",
            "--limit",
            "1",
            "--max-tokens",
            "16",
            "--concurrency",
            "1",
            "--concurrency",
            "2",
            "--request-rate",
            "50",
            "--format",
            "json",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout)
    (ab,) = out["bench"]
    assert ab["speedup"] > 0 and ab["speculative"]["tokens"] == ab["baseline"]["tokens"] > 0
    # A/B, a two-level sweep and a request-rate run: one switch to the baseline and one back for the whole command
    assert (
        r.stderr.count(f"loading {lc.BASELINE_MODEL} (") == 1 and r.stderr.count(f"loading {lc.MODEL_NAME} back") == 1
    )
    assert [row["concurrency"] for row in out["concurrency"]] == [1, 2] and out["rate"]["order"].startswith("phased")
    assert ready(llmapi_server, "tensorrt_llm") and not ready(llmapi_server, "tensorrt_llm_baseline")


def test_phase_switch_needs_the_admin_key_and_restores_on_error(llmapi_server, monkeypatch):
    """Without the admin key: one line naming --admin-key-file before anything is measured. A failure inside the
    baseline's phase still loads the speculative model back."""
    from trt_spec.harness import client as client_mod
    from trt_spec.harness.client import ClientError, LLMClient
    from trt_spec.harness.identity import check_greedy
    from trt_spec.harness.phases import speculative_then_baseline
    from trt_spec.harness.prompts import Prompt
    from trt_spec.in_triton.serving import load_tokenizer
    from trt_spec.records.names import TEXT_MODELS

    tok = load_tokenizer(str(llmapi_server.repo.parent / "build" / "engines" / "target"))
    for proto, url in (("grpc", llmapi_server.grpc_url), ("http", llmapi_server.http_url)):
        c = LLMClient(url, proto).use_tokenizer(tok)
        c.check_ready(list(TEXT_MODELS))  # with the key serve left on this host
        monkeypatch.setattr(client_mod, "served_admin_key", lambda url: None)
        with pytest.raises(ClientError) as e:
            check_greedy(c, [Prompt(PROMPT, 8)])
        assert "--admin-key-file" in str(e.value) and "\n" not in str(e.value)
        c.admin_key = "x" * 32  # a wrong key: the server's refusal, with the same fix
        with pytest.raises(ClientError, match="--admin-key-file"):
            check_greedy(c, [Prompt(PROMPT, 8)])
        monkeypatch.undo()
        assert ready(llmapi_server, "tensorrt_llm") and not ready(llmapi_server, "tensorrt_llm_baseline")
    c = LLMClient(llmapi_server.http_url, "http").use_tokenizer(tok)
    c.check_ready(list(TEXT_MODELS))

    def broken():
        assert ready(llmapi_server, "tensorrt_llm_baseline") and not ready(llmapi_server, "tensorrt_llm")
        # trt-spec serve's watchdog must not take the unloaded model's exited stub for a dead model (it exits 3 then)
        assert llmapi_server.dead_models() == []
        raise ClientError("the baseline phase failed")

    with pytest.raises(ClientError, match="the baseline phase failed"):
        speculative_then_baseline(c, lambda: None, broken)
    assert ready(llmapi_server, "tensorrt_llm") and not ready(llmapi_server, "tensorrt_llm_baseline")
    assert llmapi_server.dead_models() == []  # the speculative model's new stub serves it: nothing is dead


# -- The OpenAI API over the LLM-API model (trt-spec serve --openai-port) -------------------------------------------


@pytest.fixture(scope="module")
def llmapi_openai(farm, llmapi_server):
    """The OpenAI frontend `trt-spec serve REPO --openai-port P` starts (openai_process.FrontendProcess, checked on
    the repository first, as serve does), in front of the llmapi deployment's gRPC port."""
    openai = pytest.importorskip("openai")
    from trt_spec.in_triton.serving import load_tokenizer

    fe = farm.openai("llmapi")
    ns = type("Served", (), {})()
    ns.url, ns.openai, ns.client = fe.url, openai, fe.client
    model_yaml = yaml.safe_load((llmapi_server.repo / "tensorrt_llm/1/model.yaml").read_text())
    ns.tokenizer = load_tokenizer(model_yaml["model"])
    return ns


def kserve(server, text: str, max_tokens: int, **extra) -> dict:
    """The model's own answer to the request the frontend sends for a greedy OpenAI request."""
    return generate(
        server,
        lc.MODEL_NAME,
        {
            "text_input": text,
            "sampling_param_max_tokens": max_tokens,
            "sampling_param_exclude_input_from_output": True,
            "return_finish_reason": True,
            **extra,
        },
    )


def test_openai_completions_equal_the_models_answer_with_its_acceptance(llmapi_server, llmapi_openai):
    """Only the loaded model is listed; greedy completions, streamed and not, are the model's own text; usage is the
    target tokenizer's count; the acceptance is what the model returned (1.2.1's zeros), said to be unmeasured."""
    from trt_spec.serve.openai.metrics import LLMAPI_NOTE_KEY, LLMAPI_ZERO_NOTE

    s = llmapi_openai
    assert [m.id for m in s.client.models.list().data] == [lc.MODEL_NAME]
    with pytest.raises(s.openai.NotFoundError) as e:
        s.client.completions.create(model=lc.BASELINE_MODEL, prompt=PROMPT, max_tokens=4)
    assert "baseline phase" in e.value.body["message"] and e.value.body["code"] == "model_not_found"
    want = kserve(llmapi_server, PROMPT, 24)
    r = s.client.completions.create(model=lc.MODEL_NAME, prompt=PROMPT, max_tokens=24, temperature=0)
    text = r.choices[0].text
    assert text == want["text_output"] and r.choices[0].finish_reason == want["finish_reason"]
    assert r.usage.prompt_tokens == len(s.tokenizer.encode(PROMPT))
    # counted from the text (the model returns no ids): max_tokens when it ended for length, else re-tokenized
    retokenized = min(len(s.tokenizer.encode(text, add_special_tokens=False)), 24)
    assert r.usage.completion_tokens == (24 if want["finish_reason"] == "length" else retokenized) > 0
    zeros = {"draft_acceptance_rate": 0.0, "num_accepted_draft_tokens": 0, "num_draft_tokens": 0}
    metrics = {"speculative_decoding": zeros, LLMAPI_NOTE_KEY: LLMAPI_ZERO_NOTE}
    assert r.model_extra["metrics"] == metrics  # no histogram and no steps: the model reports none
    chunks = list(
        s.client.completions.create(
            model=lc.MODEL_NAME,
            prompt=PROMPT,
            max_tokens=24,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    parts = [c.choices[0].text for c in chunks if c.choices and c.choices[0].text]
    assert "".join(parts) == text and len(parts) > 1  # deltas of the model's whole-text responses, per iteration
    assert chunks[-2].choices[0].finish_reason == r.choices[0].finish_reason
    assert chunks[-1].choices == [] and chunks[-1].usage.model_dump() == r.usage.model_dump()
    assert chunks[-1].model_extra["metrics"] == metrics
    # a stop string: the model cannot take it (lc.STOP_INPUT), so the frontend cuts the text and ends the call there,
    # before the model's final response: no counts, so no `metrics`, as for the engine path's cut calls
    stop = text[4:7]
    cut = s.client.completions.create(model=lc.MODEL_NAME, prompt=PROMPT, max_tokens=24, temperature=0, stop=[stop])
    assert cut.choices[0].text == text[: text.index(stop)] and cut.choices[0].finish_reason == "stop"
    assert (cut.model_extra or {}).get("metrics") is None


def test_openai_chat_seeded_sampling_and_refused_engine_knobs(llmapi_server, llmapi_openai):
    s = llmapi_openai
    messages = [{"role": "user", "content": PROMPT}]
    rendered = s.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    want = kserve(llmapi_server, rendered, 16)["text_output"]
    c = s.client.chat.completions.create(model=lc.MODEL_NAME, messages=messages, max_tokens=16, temperature=0)
    assert c.choices[0].message.content == want and c.usage.prompt_tokens == len(s.tokenizer.encode(rendered))
    streamed = s.client.chat.completions.create(
        model=lc.MODEL_NAME, messages=messages, max_tokens=16, temperature=0, stream=True, user="someone"
    )
    assert "".join(x.choices[0].delta.content or "" for x in streamed if x.choices) == want  # `user` is ignored
    seeded = [
        s.client.completions.create(model=lc.MODEL_NAME, prompt=PROMPT, max_tokens=12, temperature=1.0, seed=7)
        for _ in range(2)
    ]
    assert seeded[0].choices[0].text == seeded[1].choices[0].text  # sampled with the seed, as the model samples
    for name, value in (("num_draft_tokens", 2), ("draft_len_policy", "fixed")):
        with pytest.raises(s.openai.BadRequestError) as e:
            s.client.completions.create(model=lc.MODEL_NAME, prompt=PROMPT, max_tokens=4, extra_body={name: value})
        assert e.value.body["param"] == name and "speculative_config" in e.value.body["message"]
    with urllib.request.urlopen(s.url + "/metrics", timeout=10) as r:
        exposition = r.read().decode()
    assert f'vllm:generation_tokens_total{{engine="0",model_name="{lc.MODEL_NAME}"}}' in exposition


@pytest.mark.slow  # its own server (the GPU-numerics mode is the server's environment); make slow (CI) runs it
def test_a_numerics_flip_on_the_llmapi_path_is_reported_unverified(farm, tmp_path):
    """The LLM-API model returns text only (upstream-facts: llmapi-no-logprobs), so `check` cannot tell a GPU
    near-tie from a defect there: with the stand-in's seeded GPU-numerics mode flipping near-ties in the speculative
    model's verification, check reports each divergence as UNVERIFIED (position, both continuations as text) and
    exits 3, neither passing it silently nor failing it; the JSON report carries no measured margin."""
    import os

    from trt_spec.records.defaults import GPU_NUMERICS_ENV

    from ..farm import ServeProcess, cli_in_process

    repo = farm.copy_repo("llmapi", tmp_path / "repo")
    tok_dir = str(next((farm.repo("llmapi").parent / "build" / "engines").glob("target")))
    server = ServeProcess(repo, tmp_path, env={**os.environ, GPU_NUMERICS_ENV: "4.0,1"}).wait_ready()
    try:
        args = ["check", "--url", f"127.0.0.1:{server.grpc}", "--prompts", "code-edit", "--limit", "4"]
        args += ["--max-tokens", "24", "--tokenizer", tok_dir, "--raw"]
        r = cli_in_process(*args)
        assert r.returncode == 3, r.stdout + r.stderr
        assert "unverified (no logits" in r.stdout and "UNVERIFIED: DIVERGED at token" in r.stdout
        assert "baseline goes on" in r.stdout and "verdict: UNVERIFIED (0 real mismatch(es)" in r.stdout
        rep = json.loads(cli_in_process(*args, "--format", "json").stdout)
        assert rep["verdict"] == "UNVERIFIED" and rep["unverified"] >= 1 and rep["real_mismatches"] == 0
        assert rep["measured_margin"] is None and rep["noise_floor"] is None
        for res in rep["results"]:
            d = res["divergence"]
            if d:
                assert d["kind"] == "unverified" and d["baseline_text"] != d["speculative_text"]
    finally:
        server.close()
