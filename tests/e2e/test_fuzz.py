"""Fuzzing with the ecosystem's own tools against `trt-spec serve --openai-port` with a key, over the real
tritonserver: schemathesis generates requests from the frontend's own /openapi.json (valid and invalid by it) and
checks each answer with its checks (no 5xx, the documented statuses, content types and bodies, invalid data refused,
the key enforced); hypothesis sends JSON bodies to Triton's KServe `generate` endpoints of the two text models. Every
answer is also searched for a stack trace or a path of this machine, and the servers must still answer after every
case. `make slow` (CI runs it); the counts print with -s (README's reliability figures)."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request

import pytest

schemathesis = pytest.importorskip("schemathesis")

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from schemathesis.checks import not_a_server_error  # noqa: E402
from schemathesis.specs.openapi.checks import (  # noqa: E402
    content_type_conformance,
    ignored_auth,
    negative_data_rejection,
    response_schema_conformance,
    status_code_conformance,
)

from trt_spec.records.names import BASELINE, SPECULATIVE  # noqa: E402

from ..farm import OPENAI_KEY as KEY  # noqa: E402
from ..farm import (  # noqa: E402
    ROOT,  # noqa: E402
    env_without_openai_key,
    serve_openai,
)

OPENAI_CASES = 150  # per operation and generation mode (positive, negative): ~0.05 s each on 2 cores
KSERVE_CASES = 500  # per model: ~0.02 s each
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
    negative_data_rejection,
    ignored_auth,
]
# Triton's own HTTP 500s for a client's JSON, before any model sees the request (docs/reliability.md): a value of the
# wrong type (http_server.cc ReadDataFromJsonHelper -> TritonJson's TRITONSERVER_ERROR_INTERNAL), a key holding a NUL
# character (TritonJson looks members up by C string, so the key it listed is not found) and a value nested unlike its
# shape (`"stream": [[]]`); the last two measured on 2.51. A model's own fault would say "internal error" instead.
TRITON_JSON_500S = (
    "attempt to access JSON non-",
    "' was not found in the JSON",
    "Unable to parse 'data': Shape does not match true shape of 'data' field",
)


def leaks(text: str, repo) -> list[str]:
    """What an answer must never carry: a Python or C++ stack trace, or a path of this machine."""
    marks = ["Traceback (most recent call last)", 'File "', str(ROOT), str(repo), "/tmp/", "site-packages", "/root/"]
    return [m for m in marks if m in text]


def status_of(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return 0


@pytest.fixture(scope="module")
def fuzzed(chat_repo, tmp_path_factory):
    """`trt-spec serve` with --openai-port and a key file: (process, ports, repo)."""
    tmp = tmp_path_factory.mktemp("fuzz")
    key_file = tmp / "key"
    key_file.write_text(KEY + "\n")
    proc, _, ports, err = serve_openai(
        chat_repo, tmp, f"--openai-api-key-file={key_file}", env=env_without_openai_key()
    )
    yield proc, ports, chat_repo
    proc.send_signal(2)
    try:
        proc.wait(30)
    except Exception:  # noqa: BLE001
        proc.kill()
    assert "Traceback" not in err.read_text()


@pytest.mark.slow  # ~2-3 min: `make slow`, which CI runs
def test_schemathesis_finds_no_5xx_no_leak_and_the_key_enforced(fuzzed):
    proc, ports, repo = fuzzed
    base = f"http://127.0.0.1:{ports['openai']}"
    schema = schemathesis.openapi.from_url(base + "/openapi.json")
    auth = {"Authorization": f"Bearer {KEY}"}
    tried: dict[str, int] = {}
    for result in schema.get_all_operations():
        op = result.ok()
        for mode in ("positive", "negative") if op.method.upper() == "POST" else ("positive",):  # a GET takes no body
            strategy = op.as_strategy(generation_mode=schemathesis.GenerationMode(mode))

            @settings(max_examples=OPENAI_CASES, deadline=None, database=None, suppress_health_check=list(HealthCheck))
            @given(case=strategy)
            def one(case):
                response = case.call(base_url=base, headers=auth, timeout=120)
                case.validate_response(response, checks=CHECKS, headers=auth)
                assert not leaks(response.text, repo), (case.body, response.status_code, response.text[:500])
                if op.path.startswith("/v1/"):  # the same request without the key: refused, whatever it holds
                    bare = case.call(base_url=base, timeout=120)
                    assert bare.status_code == 401 and bare.json()["error"]["code"] == "invalid_api_key", bare.text
                assert status_of(base + "/health") == 200 and proc.poll() is None, "the server died on a case"
                tried[op.label] = tried.get(op.label, 0) + 1

            one()
    total = sum(tried.values())
    print(f"schemathesis: {total} requests from /openapi.json, no 5xx, no leak, server alive: {tried}")
    assert set(tried) == {f"GET {p}" for p in ("/health", "/metrics", "/v1/models", "/v1/models/{model}")} | {
        "POST /v1/completions",
        "POST /v1/chat/completions",
    }
    assert tried["POST /v1/completions"] >= OPENAI_CASES and tried["POST /v1/chat/completions"] >= OPENAI_CASES


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False) | st.text(max_size=40),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=12,
)
# the generate endpoints' inputs (Triton's generate extension maps a JSON key to the input of that name)
FIELDS = {
    "text_input": st.text(max_size=200) | JSON_VALUES,
    "max_tokens": st.integers(-3, 40) | st.integers(-(2**40), 2**40) | JSON_VALUES,
    "stream": st.booleans() | JSON_VALUES,
    "temperature": st.floats(-1, 3) | JSON_VALUES,
    "top_k": st.integers(-2, 100) | JSON_VALUES,
    "top_p": st.floats(-0.5, 1.5) | JSON_VALUES,
    "seed": st.integers(-1, 2**64) | JSON_VALUES,
    "end_id": st.integers(-2, 70000) | JSON_VALUES,
    "pad_id": st.integers(-2, 70000) | JSON_VALUES,
    "bad_words": st.text(max_size=20) | JSON_VALUES,
    "stop_words": st.text(max_size=20) | JSON_VALUES,
    "num_draft_tokens": st.integers(-2, 10) | JSON_VALUES,
    "draft_len_policy": st.sampled_from(["fixed", "adaptive", "", "x"]) | JSON_VALUES,
    "exclude_input_in_output": st.booleans() | JSON_VALUES,
    "return_log_probs": st.booleans() | JSON_VALUES,
}
# well-formed requests with sane values (to get past the checks and generate), the same with any field fuzzed, any
# value for any known field, and any object
VALID = {"text_input": st.text(min_size=1, max_size=200), "max_tokens": st.integers(1, 16)}
SANE = {
    "temperature": st.floats(0, 2),
    "top_k": st.integers(0, 50),
    "top_p": st.floats(0.05, 1),
    "seed": st.integers(0, 2**63),
    "stop_words": st.text(min_size=1, max_size=8),
    "num_draft_tokens": st.integers(0, 4),
}
BODIES = (
    st.fixed_dictionaries(VALID, optional=SANE)
    | st.fixed_dictionaries(VALID, optional={k: v for k, v in FIELDS.items() if k not in VALID})
    | st.fixed_dictionaries({}, optional=FIELDS)
    | st.dictionaries(st.text(max_size=20), JSON_VALUES, max_size=6)
)


def post(url: str, body: bytes) -> tuple[int, str]:
    req = urllib.request.Request(url, data=body, method="POST", headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, r.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode("utf-8", "replace")


@pytest.mark.slow  # ~1-2 min: `make slow`, which CI runs
@pytest.mark.parametrize("model", [SPECULATIVE, BASELINE])
def test_hypothesis_bodies_to_tritons_generate_get_one_clear_answer(fuzzed, model):
    """Any JSON body to /v2/models/MODEL/generate: a 200 or a 4xx with one error line; the only 5xx is Triton's own
    documented wrong-type 500; no stack trace or path; the server ready after each."""
    proc, ports, repo = fuzzed
    http = f"http://127.0.0.1:{ports['http']}"
    seen: dict[int, int] = {}

    @settings(max_examples=KSERVE_CASES, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(body=BODIES)
    def one(body):
        status, text = post(f"{http}/v2/models/{model}/generate", json.dumps(body).encode())
        seen[status] = seen.get(status, 0) + 1
        if status >= 500:
            error = json.loads(text)["error"]
            assert status == 500 and any(m in error for m in TRITON_JSON_500S), (body, status, text[:300])
            assert "internal error" not in error, (body, text[:300])
        elif status != 200:
            assert 400 <= status < 500 and json.loads(text)["error"], (body, status, text[:300])
        assert not leaks(text, repo), (body, text[:500])
        assert status_of(f"{http}/v2/health/ready") == 200 and proc.poll() is None, ("server down after", body)

    t0 = time.monotonic()
    one()
    print(f"hypothesis: {sum(seen.values())} bodies to {model}/generate in {time.monotonic() - t0:.0f}s: {seen}")
    assert seen.get(200, 0) > 0 and sum(v for k, v in seen.items() if 400 <= k < 500) > 0, seen
