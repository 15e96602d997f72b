"""The frontend's OpenAPI document (serve/openai/schema.py, served at /openapi.json): schemathesis loads it, it
describes every route the app has, its bounds are the frontend's own, and no body it generates — valid or not —
makes the request parser fail any other way than with an OpenAI error (the e2e fuzz, tests/e2e/test_fuzz.py, sends
them to the real server)."""

from __future__ import annotations

import pytest

schemathesis = pytest.importorskip("schemathesis")

from hypothesis import HealthCheck, given, settings  # noqa: E402

from trt_spec.records.defaults import OPENAI_MAX_CONTENT_PARTS, OPENAI_MAX_MESSAGES  # noqa: E402
from trt_spec.records.names import NUM_DRAFT_TOKENS  # noqa: E402
from trt_spec.serve.openai.requests import MAX_STOP_SEQUENCES, OpenAIError, parse_request  # noqa: E402
from trt_spec.serve.openai.schema import openapi_document  # noqa: E402

from .test_openai_guard import KEY, SMALL, Tok, app_with, client  # noqa: E402

GENERATION = {"/v1/completions": False, "/v1/chat/completions": True}


def test_the_served_document_is_open_and_describes_every_route():
    app = app_with(settings=SMALL, api_key=KEY)
    r = client(app).get("/openapi.json")  # no key: client generators and fuzzers read it first
    assert r.status_code == 200
    doc = r.json()
    assert doc == openapi_document(SMALL, keyed=True)
    routes = {route.path for route in app.routes} - {"/openapi.json"}
    assert routes == set(doc["paths"]), routes ^ set(doc["paths"])
    assert doc["components"]["securitySchemes"]["bearerAuth"] == {"type": "http", "scheme": "bearer"}
    assert doc["paths"]["/health"]["get"]["security"] == [] and doc["paths"]["/metrics"]["get"]["security"] == []
    assert "401" in doc["paths"]["/v1/models"]["get"]["responses"]
    ops = [op.ok() for op in schemathesis.openapi.from_dict(doc).get_all_operations()]  # raises if invalid
    assert len(ops) == 6
    assert "securitySchemes" not in openapi_document(SMALL, keyed=False)["components"]


def test_its_bounds_are_the_frontends_own():
    schemas = openapi_document(SMALL, keyed=False)["components"]["schemas"]
    chat, completion = schemas["ChatCompletionRequest"]["properties"], schemas["CompletionRequest"]["properties"]
    assert chat["messages"]["maxItems"] == OPENAI_MAX_MESSAGES
    assert chat["messages"]["items"]["properties"]["content"]["anyOf"][1]["maxItems"] == OPENAI_MAX_CONTENT_PARTS
    assert completion["stop"]["anyOf"][0]["anyOf"][1]["maxItems"] == MAX_STOP_SEQUENCES
    assert completion["max_tokens"]["anyOf"][0]["maximum"] == SMALL.max_seq_len - SMALL.max_draft_len - 1
    assert completion[NUM_DRAFT_TOKENS]["anyOf"][0]["maximum"] == SMALL.max_draft_len
    assert completion["model"]["enum"] == list(SMALL.models)
    assert completion["logit_bias"]["enum"] == [None, {}]


@pytest.mark.parametrize("path", GENERATION)
@pytest.mark.parametrize("mode", ["positive", "negative"])
def test_no_generated_body_breaks_the_parser(path, mode):
    """200 bodies per route and mode, valid by the schema or not: parse_request answers each with a GenRequest or
    an OpenAIError (4xx), never another exception (which the app would turn into a 500)."""
    op = schemathesis.openapi.from_dict(openapi_document(SMALL, keyed=False))[path]["POST"]
    strategy = op.as_strategy(generation_mode=schemathesis.GenerationMode(mode))
    statuses: dict[int, int] = {}

    @settings(max_examples=200, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(case=strategy)
    def parse(case):
        try:
            parse_request(case.body, Tok(), SMALL, chat=GENERATION[path])
            status = 200
        except OpenAIError as e:
            assert 400 <= e.status < 500, (e.status, e.message, case.body)
            status = e.status
        statuses[status] = statuses.get(status, 0) + 1

    parse()
    if mode == "positive":
        assert statuses.get(200, 0) > 0, statuses  # the schema's valid bodies do get through
    else:
        assert statuses.get(400, 0) > 0, statuses


@pytest.mark.parametrize("field,value", [("logprobs", 0), ("best_of", True), ("top_logprobs", False)])
def test_a_boolean_is_not_taken_for_a_number_default_or_back(field, value):
    """The schema says `logprobs` is null or false; Python's 0 == False must not let 0 through (schemathesis's
    negative_data_rejection check found the server laxer than its document)."""
    with pytest.raises(OpenAIError) as e:
        parse_request({"model": SMALL.models[0], "prompt": "hi", field: value}, Tok(), SMALL, chat=False)
    assert e.value.status == 400 and e.value.param == field


@pytest.mark.parametrize("usage", [None, "yes", 1])
def test_include_usage_is_a_boolean_as_the_document_says(usage):
    """schemathesis found `"stream_options": {"include_usage": null}` accepted though the document says boolean."""
    body = {"model": SMALL.models[0], "prompt": "hi", "stream": True, "stream_options": {"include_usage": usage}}
    with pytest.raises(OpenAIError) as e:
        parse_request(body, Tok(), SMALL, chat=False)
    assert e.value.status == 400 and e.value.param == "stream_options"
