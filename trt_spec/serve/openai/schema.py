"""The OpenAI frontend's OpenAPI document (/openapi.json), its bounds read from where the frontend enforces them.

The routes parse raw bodies, so FastAPI cannot describe them; cross-field rules stay the server's 400s.
"""

from __future__ import annotations

from typing import Any

from ...records.defaults import OPENAI_MAX_CONTENT_PARTS, OPENAI_MAX_MESSAGES, TENANT_MAX_BYTES
from ...records.names import DRAFT_LEN_POLICY, NUM_DRAFT_TOKENS
from ...records.speculation import POLICIES
from .requests import (
    IGNORED_FIELDS,
    MAX_STOP_SEQUENCES,
    METADATA_KEY_CHARS,
    METADATA_MAX_KEYS,
    METADATA_VALUE_CHARS,
    UNSUPPORTED,
    FrontendSettings,
)

BEARER = "bearerAuth"
JSON = "application/json"
_ERROR = {"$ref": "#/components/schemas/Error"}


def _error_response(description: str, headers: dict | None = None) -> dict:
    out: dict[str, Any] = {"description": description, "content": {JSON: {"schema": _ERROR}}}
    if headers:
        out["headers"] = headers
    return out


def _denied(keyed: bool) -> dict:
    return {"401": _error_response("no bearer key, or not this server's")} if keyed else {}


def _errors(keyed: bool) -> dict:
    return {
        "400": _error_response("a field out of bounds or malformed, named with its fix"),
        "404": _error_response("no such model"),
        "413": _error_response("the body is over the frontend's --max-body-bytes"),
        "429": _error_response(
            "over --max-concurrent requests in flight and --max-queued waiting",
            {"Retry-After": {"schema": {"type": "integer"}, "description": "seconds"}},
        ),
        "503": _error_response("Triton unreachable, or the server draining: retry on another replica"),
        **_denied(keyed),
    }


def _token_bound(s: FrontendSettings) -> dict:
    """At most the room a one-token prompt leaves."""
    return {"type": "integer", "minimum": 1, "maximum": s.max_seq_len - s.max_draft_len - 1}


def _nullable(schema: dict) -> dict:
    """Null is the same as leaving the field out."""
    return {"anyOf": [schema, {"type": "null"}]}


def _common_properties(s: FrontendSettings) -> dict:
    optional: dict[str, Any] = {
        "max_tokens": _token_bound(s),
        "temperature": {"type": "number", "minimum": 0, "maximum": 2},
        "top_p": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
        "n": {"type": "integer", "enum": [1]},
        "stop": {
            "anyOf": [
                {"type": "string", "minLength": 1},
                {"type": "array", "items": {"type": "string", "minLength": 1}, "maxItems": MAX_STOP_SEQUENCES},
            ]
        },
        "seed": {"type": "integer", "minimum": 0, "maximum": 2**64 - 1},
        "stream_options": {"type": "object", "properties": {"include_usage": {"type": "boolean"}}},
        "user": {"type": "string", "maxLength": TENANT_MAX_BYTES, "description": f"at most {TENANT_MAX_BYTES} bytes"},
        "metadata": {
            "type": "object",
            "maxProperties": METADATA_MAX_KEYS,
            "propertyNames": {"maxLength": METADATA_KEY_CHARS},
            "additionalProperties": {"type": "string", "maxLength": METADATA_VALUE_CHARS},
        },
    }
    if s.llmapi:  # no per-request speculation knobs
        optional[NUM_DRAFT_TOKENS] = optional[DRAFT_LEN_POLICY] = {"type": "null"}
    else:
        optional[NUM_DRAFT_TOKENS] = {"type": "integer", "minimum": 0, "maximum": s.max_draft_len}
        optional[DRAFT_LEN_POLICY] = {"type": "string", "enum": list(POLICIES)}
    props: dict[str, Any] = {
        "model": {"type": "string", "enum": list(s.models)},
        "stream": {"type": "boolean"},
        **{name: _nullable(schema) for name, schema in optional.items()},
    }
    for name in sorted(IGNORED_FIELDS - set(props)):
        props[name] = {"description": "accepted and ignored"}
    for name, defaults in UNSUPPORTED.items():
        props[name] = {"enum": list(defaults), "description": "not served by this deployment: its default only"}
    return props


def _message() -> dict:
    part = {
        "type": "object",
        "required": ["type", "text"],
        "properties": {"type": {"const": "text"}, "text": {"type": "string"}},
    }
    return {
        "type": "object",
        "required": ["role", "content"],
        "properties": {
            "role": {"type": "string", "enum": ["system", "developer", "user", "assistant"]},
            "content": {
                "anyOf": [
                    {"type": "string"},
                    {"type": "array", "items": part, "maxItems": OPENAI_MAX_CONTENT_PARTS},
                ]
            },
        },
    }


def request_schemas(s: FrontendSettings) -> dict[str, dict]:
    """The request bodies of /v1/completions and /v1/chat/completions."""
    common = _common_properties(s)
    completion = {
        "type": "object",
        "required": ["model", "prompt"],
        "additionalProperties": False,
        "properties": {
            **common,
            "prompt": {
                "anyOf": [
                    {"type": "string", "minLength": 1},
                    {"type": "array", "items": {"type": "string", "minLength": 1}, "minItems": 1, "maxItems": 1},
                ]
            },
        },
    }
    chat = {
        "type": "object",
        "required": ["model", "messages"],
        "additionalProperties": False,
        "properties": {
            **common,
            "messages": {"type": "array", "items": _message(), "minItems": 1, "maxItems": OPENAI_MAX_MESSAGES},
            "max_completion_tokens": _nullable(_token_bound(s)),
        },
    }
    return {"CompletionRequest": completion, "ChatCompletionRequest": chat}


# one server-sent event (before OpenAPI 3.2's itemSchema, a stream's `schema` describes each event)
_SSE_EVENT = {
    "type": "object",
    "required": ["data"],
    "properties": {"data": {"type": "string"}, "event": {"type": "string"}},
}


def _generation(name: str, summary: str, keyed: bool) -> dict:
    answer = {"type": "object", "required": ["id", "object", "created", "model", "choices"]}
    return {
        "post": {
            "summary": summary,
            "requestBody": {"required": True, "content": {JSON: {"schema": {"$ref": f"#/components/schemas/{name}"}}}},
            "responses": {
                "200": {
                    "description": "the answer (JSON), or with stream: true its server-sent events",
                    "content": {JSON: {"schema": answer}, "text/event-stream": {"schema": _SSE_EVENT}},
                },
                **_errors(keyed),
            },
        }
    }


def _models_paths(keyed: bool) -> dict:
    model = {"type": "object", "required": ["id", "object", "created", "owned_by"]}
    denied = _denied(keyed)
    return {
        "/v1/models": {
            "get": {
                "summary": "the models served",
                "responses": {
                    "200": {
                        "description": "the list",
                        "content": {JSON: {"schema": {"type": "object", "required": ["object", "data"]}}},
                    },
                    **denied,
                },
            }
        },
        "/v1/models/{model}": {
            "get": {
                "summary": "one model",
                "parameters": [{"name": "model", "in": "path", "required": True, "schema": {"type": "string"}}],
                "responses": {
                    "200": {"description": "the model", "content": {JSON: {"schema": model}}},
                    "404": _error_response("no such model"),
                    **denied,
                },
            }
        },
    }


def _open_paths() -> dict:
    status = {"type": "object", "required": ["status"], "properties": {"status": {"type": "string"}}}
    return {
        "/health": {
            "get": {
                "summary": "ready: Triton answers and is ready (no key asked: probes carry none)",
                "security": [],
                "responses": {
                    "200": {"description": "ready", "content": {JSON: {"schema": status}}},
                    "503": {"description": "Triton unreachable or draining", "content": {JSON: {"schema": status}}},
                },
            }
        },
        "/metrics": {
            "get": {
                "summary": "Prometheus exposition (no key asked: scrapers carry none)",
                "security": [],
                "responses": {
                    "200": {"description": "metrics", "content": {"text/plain": {"schema": {"type": "string"}}}}
                },
            }
        },
    }


def openapi_document(s: FrontendSettings, keyed: bool) -> dict:
    """The document /openapi.json serves; `keyed`: the frontend asks for a bearer key on /v1/*."""
    doc: dict[str, Any] = {
        "openapi": "3.1.0",
        "info": {"title": "trt-spec OpenAI-compatible frontend", "version": "1"},
        "paths": {
            **_open_paths(),
            **_models_paths(keyed),
            "/v1/completions": _generation("CompletionRequest", "a text completion", keyed),
            "/v1/chat/completions": _generation("ChatCompletionRequest", "a chat completion", keyed),
        },
        "components": {
            "schemas": {
                **request_schemas(s),
                "Error": {
                    "type": "object",
                    "required": ["error"],
                    "properties": {
                        "error": {
                            "type": "object",
                            "required": ["message", "type"],
                            "properties": {
                                "message": {"type": "string"},
                                "type": {"type": "string"},
                                "param": {"type": ["string", "null"]},
                                "code": {"type": ["string", "null"]},
                            },
                        }
                    },
                },
            },
        },
    }
    if keyed:
        doc["components"]["securitySchemes"] = {BEARER: {"type": "http", "scheme": "bearer"}}
        doc["security"] = [{BEARER: []}]
    return doc
