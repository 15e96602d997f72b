"""The agentic set (`--prompts agentic`): multi-turn whole-file edits of CPython standard-library functions, each
turn carrying the earlier file and the model's own answers; `bench` runs a conversation's turns in order under one
tenant of its own and reports per turn index and per conversation (tok/s, speedup, tokens per target call, the share
of tokens from the cross-request cache). The shape of the shipped set, the tenants and report with a fake server, and
a bench over the farm's shared n-gram server."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from trt_spec.harness.bench import Chat, ab_measurement
from trt_spec.harness.client import Generation
from trt_spec.harness.phases import measure
from trt_spec.harness.prompts import (
    AGENTIC_DATA,
    PROMPT_SETS,
    agentic_turns,
    conversation,
    default_turns,
    load_prompts,
    render_conversation,
)
from trt_spec.harness.report import markdown
from trt_spec.records.names import BASELINE, CACHE_ACCEPTED_TOKENS, SPECULATIVE, TOTAL_STEPS

DATA = Path(__file__).resolve().parents[2] / "trt_spec" / "harness" / "data"
STDLIB = Path("/usr/lib/python3.11")


def _doc() -> dict:
    return json.loads((DATA / AGENTIC_DATA).read_text())


def _code_block(text: str) -> str:
    return re.search(r"```python\n(.*?)```", text, re.S).group(1)


def test_the_set_is_multi_turn_whole_file_edits_each_later_turn_carrying_the_earlier_file():
    prompts = load_prompts("agentic")
    assert len(prompts) >= 8 and len({p.id for p in prompts}) == len(prompts)
    assert all(p.category == "agentic" for p in prompts) and default_turns("agentic") == "all"
    assert default_turns("code-edit") == "first"
    for p, c in zip(prompts, _doc()["conversations"]):
        assert len(p.turns) >= 3, p.id
        file = _code_block(p.turns[0])
        assert file == c["file"] and 30 <= file.count("\n") <= 80, p.id
        assert all("whole updated file" in t for t in p.turns) and not any("```" in t for t in p.turns[1:])
        # turn t's conversation: the earlier file, every earlier request and the model's own earlier answers
        answers = [f"answer {j} of {p.id}" for j in range(1, len(p.turns))]
        for t in range(2, len(p.turns) + 1):
            msgs = conversation(p.turns, answers[: t - 1])
            assert msgs[0]["content"] == p.turns[0] and file in msgs[0]["content"]
            assert [m["content"] for m in msgs if m["role"] == "assistant"] == answers[: t - 1]
            assert msgs[-1] == {"role": "user", "content": p.turns[t - 1]}


def test_the_readme_names_each_source_and_the_licence_and_forbids_tuning():
    readme = (DATA / "README.md").read_text()
    assert "Python Software Foundation License" in readme and "Not for tuning" in readme
    for c in _doc()["conversations"]:
        assert f"`{c['id']}` | `{c['source']}` |" in readme
        assert all(f"`{f}`" in readme for f in c["functions"])


def test_the_code_is_cpythons_verbatim():
    """Every line of every file is in the standard-library file it names (where this machine has CPython 3.11)."""
    if not STDLIB.is_dir():
        pytest.skip(f"no {STDLIB} here")
    for c in _doc()["conversations"]:
        src = (STDLIB / c["source"].removeprefix("Lib/")).read_text().splitlines()
        taken = [ln for a, b in c["lines"] for ln in src[a - 1 : b]]
        assert [ln for ln in c["file"].splitlines() if ln] == [ln for ln in taken if ln], c["id"]


def test_no_shipped_set_shares_a_snippet_with_the_agentic_one():
    agentic = {_code_block(p.text) for p in PROMPT_SETS["agentic"]}
    others = [p.text for name, ps in PROMPT_SETS.items() if name != "agentic" for p in ps]
    assert not any(f in t for f in agentic for t in others)


# --- the bench with a fake server: tenants, order and the report ---------------------------------------------------


class Agent:
    """A served pair that echoes the conversation's last user turn back, reporting target calls and cache-backed
    tokens on the speculative side; every request is recorded with the tenant it was sent as."""

    phased = False
    protocol = "fake"

    def __init__(self):
        self.tenant = "team-a"  # --tenant: the conversations' tenants are made under it
        self.sent: list[tuple[str, object, int, object]] = []

    def generate(self, model, prompt, max_tokens, *, stream=False, **params) -> Generation:
        self.sent.append((model, prompt, max_tokens, self.tenant))
        turn = sum(m["role"] == "user" for m in prompt)
        metrics = {TOTAL_STEPS: 2, CACHE_ACCEPTED_TOKENS: 0 if turn == 1 else 3} if model == SPECULATIVE else {}
        text = f"file after turn {turn}"
        return Generation(text, [], 0.01, 0.2 if model == BASELINE else 0.1, 1, tokens=6, metrics=metrics)


def test_each_conversation_runs_its_turns_in_order_under_one_fresh_tenant_and_is_reported_per_turn():
    prompts = load_prompts("agentic")[:2]
    client = Agent()
    rep = measure(client, [ab_measurement(client, prompts, k=4, repeats=2, warmup=1, chat=Chat(lambda m: m))])[0]
    measured = [(p, t) for m, p, n, t in client.sent if m == SPECULATIVE and n > 1]
    assert measured[0][1] == "team-a"  # the warm-up goes as the client's own tenant
    runs = [measured[j : j + 3] for j in range(1, len(measured), 3)]  # conversation 0, 1 of repeat 0, then repeat 1
    assert len(runs) == 4 and [[len(p) for p, _ in r] for r in runs] == [[1, 3, 5]] * 4  # turns 1, 2, 3 in order
    tenants = [{t for _, t in r} for r in runs]
    assert all(len(t) == 1 for t in tenants) and len(set().union(*tenants)) == 4  # one each, never shared
    assert all(next(iter(t)).startswith("team-a/") for t in tenants)
    assert all(m["content"] == f"file after turn {j + 1}" for r in runs for p, _ in r for j, m in enumerate(p[1::2]))
    assert {t for m, _, n, t in client.sent if n == 1} == {None}  # primed outside every tenant's cache
    c = rep["conversations"]
    assert c["identical"] == c["turns"] == 12
    assert [(r["turn"], r["requests"], r["tokens_per_target_call"], r["cache_share"]) for r in c["per_turn"]] == [
        (1, 4, 3.0, 0.0),
        (2, 4, 3.0, 0.5),
        (3, 4, 3.0, 0.5),
    ]
    assert [(r["id"], r["requests"], r["speedup"]) for r in c["per_conversation"]] == [
        (prompts[0].id, 6, pytest.approx(2.0)),
        (prompts[1].id, 6, pytest.approx(2.0)),
    ]
    md = markdown({"title": "t", "environment": {"time": "now"}, "bench": [{"protocol": "fake", **rep}]})
    assert "### Per turn" in md and "| 2 | 4 | 30.0 | 60.0 | 2.00x |" in md and "| 3.00 | 50% | 4/4 |" in md
    assert f"| {prompts[0].id} | 6 |" in md and "### Per conversation" in md


# --- against the farm's shared n-gram server ------------------------------------------------------------------------


def _trimmed(n_lines: int = 2) -> dict:
    """Conversation 0 of the set, built by the set's own agentic_turns, cut to fit the tiny test model's 384-token
    prompt limit (its tokenizer spends about a token a character): the file's first lines, short edit requests."""
    doc, c = _doc(), _doc()["conversations"][0]
    file = "".join(c["file"].splitlines(keepends=True)[:n_lines])
    short = {"first_turn": "{edit}\n```python\n{file}```", "later_turn": "{edit}"}
    edits = [e.split(":")[0].split("(")[0][:28] for e in c["edits"]]
    assert doc["first_turn"].count("{file}") == 1
    return {"question_id": c["id"], "category": "agentic", "turns": list(agentic_turns(file, edits, short))}


def test_bench_served_runs_the_agentic_turns_in_order_under_one_tenant(ngram_server, tmp_path, monkeypatch):
    from trt_spec.harness.client import LLMClient
    from trt_spec.in_triton.serving import load_tokenizer

    from ..farm import cli_in_process, tokenizer_dir

    row = _trimmed()
    f = tmp_path / "agentic.jsonl"
    f.write_text(json.dumps(row) + "\n")
    sent = []
    generate = LLMClient.generate

    def recorded(self, model, prompt, max_tokens, **kw):
        g = generate(self, model, prompt, max_tokens, **kw)
        sent.append((model, prompt, max_tokens, self.tenant, g))
        return g

    monkeypatch.setattr(LLMClient, "generate", recorded)
    tok_dir = tokenizer_dir(ngram_server.repo)
    p = cli_in_process(
        "bench", "served", "--url", ngram_server.grpc_url, "--protocol", "grpc", "--prompts", str(f),
        "--turns", "all", "--tokenizer", tok_dir, "--max-tokens", "8", "--k", "4", "--policy", "fixed",
        "--repeats", "2", "--format", "json",
    )  # fmt: skip
    assert p.returncode == 0, p.stderr[-2000:]
    b = json.loads(p.stdout)["bench"][0]
    c = b["conversations"]
    assert c["identical"] == c["turns"] == 6  # identity held on every turn of both repeats
    assert [r["turn"] for r in c["per_turn"]] == [1, 2, 3] and [r["id"] for r in c["per_conversation"]] == [
        row["question_id"]
    ]
    for r in c["per_turn"]:
        assert r["requests"] == 2 and r["identical"] == 2 and r["tokens_per_target_call"] >= 1.0
        assert r["cache_share"] is not None  # the server reports its cache-backed tokens
    assert c["per_turn"][0]["cache_share"] == 0.0  # a new tenant: nothing cached before turn 1, nor from repeat 0
    assert all(r["cache_share"] > 0 for r in c["per_turn"][1:])  # the tenant's store held the earlier turns
    # in order, one tenant per conversation and repeat, the previous answer in the next turn's history
    tok = load_tokenizer(tok_dir)
    spec = [(prompt, tenant, g) for model, prompt, n, tenant, g in sent if model == SPECULATIVE and tenant]
    runs = [spec[j : j + 3] for j in range(0, len(spec), 3)]
    assert len(runs) == 2 and len({t for r in runs for _, t, _ in r}) == 2
    for r in runs:
        assert len({t for _, t, _ in r}) == 1
        answers = [tok.decode(g.output_ids, skip_special_tokens=True) for _, _, g in r]
        for t, (prompt, _, _) in enumerate(r):
            assert prompt == render_conversation(tok, conversation(row["turns"], answers[:t]))
        assert row["turns"][0] in r[2][0] and answers[1] in r[2][0]
    samples = [s for s in b["samples"] if s["model"] == SPECULATIVE]
    assert [(s["repeat"], s["turn"]) for s in samples] == [(0, 1), (0, 2), (0, 3), (1, 1), (1, 2), (1, 3)]
    assert [s["tenant"] for s in samples] == [t for r in runs for _, t, _ in r]
