"""The CPU `runtime: llmapi` deployment on the real tritonserver: the stand-in of TensorRT-LLM's LLM-API model answers
NVIDIA's documented request, speculates inside the model (n-gram, no BLS), and its speculative model's text equals the
baseline model's."""

from __future__ import annotations

import json
import urllib.request

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import yaml

from trt_spec.build.plan import make_plan
from trt_spec.build.preflight import run_preflight
from trt_spec.build.runner import run_plan
from trt_spec.records.config import load_config
from trt_spec.records.manifest import BuildManifest
from trt_spec.serve.repository import write_repository

from .conftest import _serve

PROMPT = "def add(a, b):\n    return a + b\n\ndef add(a, b):\n    return"


@pytest.fixture(scope="module")
def llmapi_server(tiny_models, tmp_path_factory):
    root = tmp_path_factory.mktemp("llmapi")
    cfg = {"engine": "reference", "runtime": "llmapi", "target": {"checkpoint": str(tiny_models["target"])},
           "quantization": {"weights": "fp32"}, "speculative": {"mode": "ngram", "max_draft_len": 4, "ngram_size": 3},
           "limits": {"max_batch_size": 4, "max_input_len": 384, "max_seq_len": 512, "max_num_tokens": 512},
           "output_dir": str(root / "build")}
    path = root / "ngram.yaml"
    path.write_text(yaml.safe_dump(cfg))
    c = load_config(path)
    run_plan(make_plan(c, run_preflight(c, None, require_checkpoints=True), path), config_path=path)
    repo = root / "repo"
    write_repository(BuildManifest.read(root / "build"), repo)
    server = _serve(repo, root / "server.log")
    yield server
    server.stop()


def generate(server, model: str, body: dict) -> dict:
    """NVIDIA's documented request: POST /v2/models/tensorrt_llm/generate with text_input and sampling_param_*."""
    req = urllib.request.Request(f"http://{server.http_url}/v2/models/{model}/generate", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return json.loads(r.read())
    except urllib.error.HTTPError as e:
        return {"status": e.code, **json.loads(e.read() or b"{}")}


def test_nvidias_documented_request_and_identity_with_the_baseline(llmapi_server):
    body = {"text_input": PROMPT, "sampling_param_max_tokens": 24}
    spec, base = generate(llmapi_server, "tensorrt_llm", body), generate(llmapi_server, "tensorrt_llm_baseline", body)
    assert spec["text_output"].startswith(PROMPT)  # exclude_input_from_output defaults to False, as NVIDIA's model
    assert len(spec["text_output"]) > len(PROMPT) and spec["text_output"] == base["text_output"]
    only = generate(llmapi_server, "tensorrt_llm",
                    {**body, "sampling_param_exclude_input_from_output": True, "sampling_param_return_perf_metrics": True,
                     "return_finish_reason": True})
    assert PROMPT + only["text_output"] == spec["text_output"]
    # the perf outputs are strings, as NVIDIA's model writes them; n-gram speculation drafted on this prompt
    assert isinstance(only["total_draft_tokens"], str) and int(only["total_draft_tokens"]) > 0
    assert 0 <= float(only["acceptance_rate"]) <= 1 and only["finish_reason"] in ("length", "stop")
    nospec = generate(llmapi_server, "tensorrt_llm_baseline", {**body, "sampling_param_return_perf_metrics": True})
    assert nospec["total_draft_tokens"] == "0"


def test_streaming_over_grpc_concatenates_to_the_completion(llmapi_server):
    whole = generate(llmapi_server, "tensorrt_llm", {"text_input": PROMPT, "sampling_param_max_tokens": 24,
                                                     "sampling_param_exclude_input_from_output": True})["text_output"]
    c = grpcclient.InferenceServerClient(llmapi_server.grpc_url)
    got = []
    c.start_stream(callback=lambda result, error: got.append((result, error)))
    ins = []
    for name, value, dtype in (("text_input", PROMPT.encode(), "BYTES"), ("streaming", True, "BOOL"),
                               ("sampling_param_max_tokens", 24, "INT32")):
        arr = np.array([value], dtype=object if dtype == "BYTES" else (bool if dtype == "BOOL" else np.int32))
        t = grpcclient.InferInput(name, [1], dtype)
        t.set_data_from_numpy(arr)
        ins.append(t)
    c.async_stream_infer("tensorrt_llm", ins, enable_empty_final_response=True)
    import time

    deadline = time.time() + 60
    while time.time() < deadline and not any(r is not None and r.get_response().parameters["triton_final_response"]
                                             .bool_param for r, _ in got):
        time.sleep(0.05)
    c.stop_stream()
    assert all(e is None for _, e in got)
    chunks = [r.as_numpy("text_output") for r, _ in got if r is not None and r.as_numpy("text_output") is not None]
    text = "".join(x.decode() for a in chunks for x in a.reshape(-1))
    assert text == whole and len(chunks) > 1


def test_stop_strings_and_refusals_in_the_models_words(llmapi_server):
    full = generate(llmapi_server, "tensorrt_llm", {"text_input": PROMPT, "sampling_param_max_tokens": 24,
                                                    "sampling_param_exclude_input_from_output": True})["text_output"]
    stop = full[4:7]
    cut = generate(llmapi_server, "tensorrt_llm", {"text_input": PROMPT, "sampling_param_max_tokens": 24,
                                                   "sampling_param_exclude_input_from_output": True,
                                                   "sampling_param_stop": [stop]})["text_output"]
    assert cut == full[: full.index(stop)]
    bad = generate(llmapi_server, "tensorrt_llm", {"text_input": PROMPT, "sampling_param_max_tokens": 100000})
    assert bad["status"] == 400 and bad["error"].startswith("Error generating request: ")


def test_check_and_bench_against_the_llmapi_models(llmapi_server, tmp_path):
    """The harness maps its baseline and speculative roles onto tensorrt_llm_baseline and tensorrt_llm (the LLM-API
    path has no ensemble), counts tokens with the target's tokenizer, and proves identity and measures speedup."""
    import subprocess
    import sys

    from trt_spec.harness.bench import paired_ab
    from trt_spec.harness.client import ClientError, LLMClient
    from trt_spec.harness.prompts import Prompt
    from trt_spec.records.names import TEXT_MODELS
    from trt_spec.served.serving import load_tokenizer

    tok_dir = str(next((llmapi_server.repo.parent / "build" / "engines").glob("target")))
    bare = LLMClient(llmapi_server.grpc_url, "grpc")
    bare.check_ready(list(TEXT_MODELS))
    assert bare.names == {"ensemble": "tensorrt_llm_baseline", "tensorrt_llm_bls": "tensorrt_llm"}
    with pytest.raises(ClientError, match="returns text only: pass --tokenizer"):
        bare.generate("tensorrt_llm_bls", PROMPT, 8)
    for proto, url in (("grpc", llmapi_server.grpc_url), ("http", llmapi_server.http_url)):
        r = subprocess.run([sys.executable, "-m", "trt_spec.cli", "check", "--url", url, "--protocol", proto,
                            "--prompts", "code-edit", "--limit", "2", "--max-tokens", "16", "--tokenizer", tok_dir,
                            "--raw", "--format", "json"], capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr[-2000:]
        rep = json.loads(r.stdout)
        assert rep["passed"] and rep["match_rate"] == 1.0
        assert all(x["baseline_tokens"] > 0 for x in rep["results"]), rep
    c = LLMClient(llmapi_server.grpc_url, "grpc").use_tokenizer(load_tokenizer(tok_dir))
    c.check_ready(list(TEXT_MODELS))
    res = paired_ab(c, [Prompt(PROMPT, 24)], warmup=0)
    assert res["speedup"] > 0 and res["speculative"]["tokens"] == res["baseline"]["tokens"] > 0
    assert res["acceptance"]["drafted"] > 0  # the model's own perf outputs, parsed from their strings
    r = subprocess.run([sys.executable, "-m", "trt_spec.cli", "bench", "--url", llmapi_server.grpc_url, "--tokenizer",
                        tok_dir, "--prompts", "code-edit", "--limit", "1", "--max-tokens", "16", "--format", "json"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    (ab,) = json.loads(r.stdout)["bench"]
    assert ab["speedup"] > 0 and ab["speculative"]["tokens"] == ab["baseline"]["tokens"] > 0
