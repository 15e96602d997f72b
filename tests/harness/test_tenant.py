"""bench --tenant: the harness clients send the tenant with speculative requests only (the BLS's `tenant` input over
Triton, OpenAI's `user` over the OpenAI API), and a cloned client (the concurrency sweep's) keeps it."""

from __future__ import annotations

from trt_spec.harness.client import LLMClient
from trt_spec.records.names import BASELINE, SPECULATIVE, TENANT


def test_llm_client_sends_the_tenant_to_the_speculative_model_only(monkeypatch):
    sent = []
    monkeypatch.setattr(LLMClient, "_grpc_generate", lambda self, model, fields: sent.append((model, fields)))
    c = LLMClient("127.0.0.1:1", "grpc")
    c.tenant = "team-a"
    for client in (c, c.clone()):
        client.generate(SPECULATIVE, "x", 4)
        client.generate(BASELINE, "x", 4)
    assert [f.get(TENANT) for _, f in sent] == ["team-a", None, "team-a", None]
    c.tenant = None
    c.generate(SPECULATIVE, "x", 4)
    assert TENANT not in sent[-1][1]


def test_openai_client_sends_user_to_the_speculative_model_only():
    from trt_spec.harness.openai_client import OpenAIClient, endpoints

    bodies = []

    class Completions:
        def create(self, **body):
            bodies.append(body)
            return iter(())

    c = OpenAIClient(endpoints(("http://127.0.0.1:1/v1",), ()), api="completions", tenant="team-a")
    for role in (SPECULATIVE, BASELINE):
        c._clients[role].completions = Completions()
        c.generate(role, "x", 4)
    assert bodies[0]["user"] == "team-a" and "user" not in bodies[1]
