"""--turns all: Spec-Bench's multi-turn questions as conversations, each turn one paired request with each model fed its
own answers (MT-Bench's way). The conversation each turn sends, the report's rows per turn, the first-turn default
left as it was, the refusals (no chat template, a load run), and the in-process bench end to end over a 2-turn
Spec-Bench-shaped file on a tiny deployment whose tokenizer has a chat template."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from trt_spec.cli import main
from trt_spec.harness.bench import Chat, ab_measurement, paired, per_category
from trt_spec.harness.client import ClientError, Generation
from trt_spec.harness.phases import measure
from trt_spec.harness.prompts import conversation, load_prompts, render_conversation
from trt_spec.harness.report import markdown
from trt_spec.records.names import BASELINE, SPECULATIVE

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
ROWS = [
    {"question_id": 81, "category": "writing", "turns": ["Write a poem.", "Now shorten it."]},
    {"question_id": 82, "category": "qa", "turns": ["Who wrote Hamlet?"]},
    {"question_id": 83, "category": "qa", "turns": ["Name a prime.", "Name a bigger one."]},
]


def _file(tmp_path: Path, rows=ROWS) -> Path:
    f = tmp_path / "question.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return f


class Talker:
    """A served pair of models that answers from the last user message it is sent (a chat client's view: messages
    in, text out), the speculative one differently on `diverge` (a user message): every request is recorded."""

    phased = False
    protocol = "fake"

    def __init__(self, diverge: str = ""):
        self.diverge, self.sent, self.primed = diverge, [], []

    def generate(self, model, prompt, max_tokens, *, stream=False, **params) -> Generation:
        (self.primed if max_tokens == 1 else self.sent).append((model, prompt))  # one token: bench._prime
        if isinstance(prompt, list):
            last = prompt[-1]["content"]
        else:  # a conversation in CHATML: its last user message
            last = prompt.rsplit("<|im_start|>user\n", 1)[-1].split("<|im_end|>")[0]
        text = f"re[{last}]" + ("!" if model == SPECULATIVE and last == self.diverge else "")
        return Generation(text, [], 0.01, 0.1 if model == BASELINE else 0.05, 1, tokens=3)


def _run(client, prompts, chat):
    return measure(client, [ab_measurement(client, prompts, k=2, warmup=0, chat=chat)])[0]


def test_a_turn_sends_the_whole_conversation_with_the_models_own_answer(tmp_path):
    assert conversation(["Q1", "Q2"], ["A1"]) == [
        {"role": "user", "content": "Q1"},
        {"role": "assistant", "content": "A1"},
        {"role": "user", "content": "Q2"},
    ]
    with pytest.raises(ValueError, match="turn 3 of a 2-turn conversation"):
        conversation(["Q1", "Q2"], ["A1", "A2"])
    from transformers import AutoTokenizer

    from ..tiny import make_tokenizer

    tok = AutoTokenizer.from_pretrained(make_tokenizer(tmp_path / "tok"))
    tok.chat_template = CHATML
    text = render_conversation(tok, conversation(["Q1", "Q2"], ["A1"]))
    assert text == (
        "<|im_start|>user\nQ1<|im_end|>\n<|im_start|>assistant\nA1<|im_end|>\n"
        "<|im_start|>user\nQ2<|im_end|>\n<|im_start|>assistant\n"
    )
    # over the bench: turn 2 of each side is turn 1 + that side's own answer + turn 2
    client = Talker()
    prompts = load_prompts(str(_file(tmp_path)))
    _run(client, prompts, Chat(lambda m: render_conversation(tok, m)))
    turn2 = [p for model, p in client.sent if "Now shorten it." in p]
    assert len(turn2) == 2 and all(
        p == render_conversation(tok, conversation(["Write a poem.", "Now shorten it."], ["re[Write a poem.]"]))
        for p in turn2
    )


def test_report_rows_per_turn_each_side_fed_its_own_answers(tmp_path):
    """Paired per turn (5 turns of 3 questions), the turn and category on every sample, the per-category table counting
    turns, and an answer that differs is an identity failure the report names; the next turn uses each side's own."""
    prompts = load_prompts(str(_file(tmp_path)))
    client = Talker(diverge="Name a prime.")
    rep = _run(client, prompts, Chat(lambda m: m))  # the OpenAI chat API's form: the messages themselves
    samples = rep["samples"]
    assert rep["requests"] == 5 and len(samples) == 10
    spec = [(s["prompt"], s["turn"], s["category"]) for s in samples if s["model"] == SPECULATIVE]
    assert spec == [(0, 1, "writing"), (0, 2, "writing"), (1, 1, "qa"), (2, 1, "qa"), (2, 2, "qa")]
    assert [(r["category"], r["prompts"], r["turns"], r["requests"]) for r in rep["categories"]] == [
        ("writing", 1, 2, 2),
        ("qa", 2, 3, 3),
    ]
    c = rep["conversations"]
    assert (c["turns"], c["identical"]) == (5, 4)
    assert c["differ"] == [{"prompt": 2, "repeat": 0, "turn": 1, "category": "qa"}]
    second = {model: p for model, p in client.sent if isinstance(p, list) and len(p) == 3 and "prime" in str(p)}
    assert second[BASELINE][1]["content"] == "re[Name a prime.]" and second[SPECULATIVE][1]["content"] == (
        "re[Name a prime.]!"
    )
    md = markdown({"title": "t", "environment": {"time": "now"}, "bench": [{"protocol": "openai chat", **rep}]})
    assert "IDENTITY FAILURE: 1 of 5 turns differ (prompt 2 turn 1)" in md
    assert "| category | prompts | turns | speedup |" in md and "| writing | 1 | 2 | 2.00x |" in md
    # the same in phases (each model's half on its own): the same pairs, per turn
    m = ab_measurement(client, prompts, k=2, warmup=0, chat=Chat(lambda m: m))
    phased = m.pair(m.speculative(None), m.baseline(None))
    assert phased["conversations"]["differ"] == c["differ"] and phased["requests"] == 5


def test_an_error_past_the_first_turn_names_the_question_and_turn(tmp_path):
    class TooLong(Talker):
        def generate(self, model, prompt, max_tokens, **kw):
            if len(prompt) > 1:
                raise ClientError("prompt (400 tokens) exceeds the engine's input limit 383")
            return super().generate(model, prompt, max_tokens, **kw)

    with pytest.raises(ClientError) as e:
        _run(TooLong(), load_prompts(str(_file(tmp_path))), Chat(lambda m: m))
    assert str(e.value).startswith("question 81 turn 2 (")
    assert "exceeds the engine's input limit 383" in str(e.value) and "--turns first" in str(e.value)


def test_the_first_turn_default_is_unchanged(tmp_path):
    prompts = load_prompts(str(_file(tmp_path)))
    assert [p.text for p in prompts] == ["Write a poem.", "Who wrote Hamlet?", "Name a prime."]
    assert prompts[0].turns == ("Write a poem.", "Now shorten it.") and prompts[1].turns == ("Who wrote Hamlet?",)
    client = Talker()
    rep = _run(client, prompts, None)
    assert [p for _, p in client.sent] == [p.text for p in prompts for _ in range(2)]  # first turns, as text
    # before each pair both models prefilled its prompt (so neither side rides on the other's prefix cache)
    assert client.primed == [(m, p.text) for p in prompts for m in (BASELINE, SPECULATIVE)]
    assert {s["turn"] for s in rep["samples"]} == {1} and "conversations" not in rep
    assert all(r["turns"] == r["prompts"] for r in rep["categories"])
    md = markdown({"title": "t", "environment": {"time": "now"}, "bench": [{"protocol": "grpc", **rep}]})
    assert "| category | prompts | speedup |" in md and "turns" not in md and "Conversations" not in md


def test_pairs_are_per_turn():
    from trt_spec.harness.bench import RequestSample

    s = [RequestSample(m, 0, 0, 3, 0.1, 1.0, 0.1, turn=t) for t in (1, 2) for m in (BASELINE, SPECULATIVE)]
    assert [(b.turn, x.turn) for b, x in paired(s)] == [(1, 1), (2, 2)]
    assert per_category(s) == []  # one category: no table


@pytest.mark.parametrize(
    "cmd, words",
    [
        (("bench", "served", "--url", "127.0.0.1:1"), "pass --tokenizer DIR"),
        (("bench", "openai", "--url", "http://127.0.0.1:1", "--api", "completions"), "--api chat"),
        (("bench", "served", "--url", "127.0.0.1:1", "--tokenizer", "TOK"), "has no chat template"),
        (("bench", "served", "--url", "127.0.0.1:1", "--concurrency", "2"), "paired A/B only"),
        (("bench", "openai", "--url", "http://127.0.0.1:1", "--request-rate", "1"), "paired A/B only"),
    ],
    ids=["served raw", "openai completions raw", "a tokenizer without a template", "concurrency", "request rate"],
)
def test_turns_all_without_a_chat_template_is_one_line_before_any_server(cmd, words, tmp_path):
    from ..tiny import make_tokenizer

    tok = str(make_tokenizer(tmp_path / "tok"))  # no chat template
    args = [tok if a == "TOK" else a for a in cmd]
    r = CliRunner().invoke(main, [*args, "--prompts", str(_file(tmp_path)), "--turns", "all"], catch_exceptions=False)
    lines = r.output.strip().splitlines()
    assert r.exit_code == 2 and len(lines) == 1 and lines[0].startswith("error: --turns all ") and words in lines[0], (
        r.output
    )
    assert "no server" not in r.output and "127.0.0.1:1" not in r.output  # refused before any server is reached


# --- in process, end to end ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def chat_deployment(farm):
    """The farm's draft-target deployment of a tiny target whose tokenizer has a chat template (the draft is the
    target)."""
    pytest.importorskip("torch")
    return farm.config("dtm_copy")


def _in_process(config: Path, f: Path, *args):
    """`trt-spec bench in-process` (in this process: the CLI's own code, no new interpreter)."""
    from ..farm import cli_in_process

    return cli_in_process(
        "bench", "in-process", str(config), "--prompts", str(f),
        "--max-tokens", "6", "--ignore-eos", "--threads", "1", "--k", "2", "--policy", "fixed", *args,
    )  # fmt: skip


def test_in_process_runs_every_turn_as_a_conversation(chat_deployment, tmp_path):
    f = _file(tmp_path)
    p = _in_process(chat_deployment, f, "--turns", "all", "--format", "json")
    assert p.returncode == 0, p.stderr[-2000:]
    rep = json.loads(p.stdout)
    row = rep["sweep"][0]
    assert rep["turns"] == "all" and rep["prompts"] == 3
    assert [(s["prompt"], s["turn"], s["category"]) for s in row["samples"]] == [
        ("81", 1, "writing"),
        ("81", 2, "writing"),
        ("82", 1, "qa"),
        ("83", 1, "qa"),
        ("83", 2, "qa"),
    ]
    assert row["token_identity"] == 1.0 and all(s["identical"] and s["tokens"] == 6 for s in row["samples"])
    assert row["acceptance_rate"] == 1.0  # the draft is the target
    assert [(c["category"], c["prompts"], c["turns"], c["requests"]) for c in row["categories"]] == [
        ("writing", 1, 2, 2),
        ("qa", 2, 3, 3),
    ]
    text = _in_process(chat_deployment, f, "--turns", "all").stdout
    header = next(ln for ln in text.splitlines() if ln.strip().startswith("category"))
    assert "every turn (5 turns" in text and header.split()[:3] == ["category", "prompts", "turns"]
    assert [ln.split()[:3] for ln in text.splitlines() if ln.startswith(("  writing", "  qa"))] == [
        ["writing", "1", "2"],
        ["qa", "2", "3"],
    ]
    # the default: first turns only, as before
    first = json.loads(_in_process(chat_deployment, f, "--format", "json").stdout)
    assert first["turns"] == "first" and [s["turn"] for s in first["sweep"][0]["samples"]] == [1, 1, 1]


def test_in_process_a_conversation_past_the_input_limit_is_one_line_before_any_work(chat_deployment, tmp_path):
    long = " ".join(["The quick brown fox jumps over the lazy dog."] * 60)  # turn 2 alone is past 384 tokens
    f = _file(tmp_path, [{"question_id": 7, "category": "qa", "turns": ["Hi.", long]}])
    p = _in_process(chat_deployment, f, "--turns", "all")
    assert p.returncode == 2 and "Traceback" not in p.stderr
    (line,) = [ln for ln in p.stderr.splitlines() if ln.startswith("error:")]
    assert line.startswith("error: question 7 turn 2: ") and "--turns first" in line
    assert _in_process(chat_deployment, f).returncode == 0  # the first turn alone fits


def test_in_process_without_a_chat_template_refuses_turns_all(farm, tmp_path):
    pytest.importorskip("torch")
    p = _in_process(farm.config("dtm_fixed"), _file(tmp_path), "--turns", "all")  # its target has no chat template
    assert p.returncode == 2 and "Traceback" not in p.stderr
    (line,) = [ln for ln in p.stderr.splitlines() if ln.startswith("error:")]
    assert line.startswith("error: --turns all ") and "has none" in line and "--turns first" in line
