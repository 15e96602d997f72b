"""Prompt sets shipped with trt-spec (code-edit, code, chat, summarization, agentic), and prompt files (JSONL,
Spec-Bench, ShareGPT). `code-edit` answers copy most of the prompt, where n-gram drafting shines; `agentic` is
multi-turn whole-file edits of CPython standard-library functions (data/agentic.json, data/README.md).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path
from typing import Sequence

from ..records import defaults

DEFAULT_MAX_TOKENS = 128


@dataclass(frozen=True)
class Prompt:
    text: str  # the user message, no chat template
    max_tokens: int = DEFAULT_MAX_TOKENS
    id: str = ""
    category: str = ""
    follow_ups: tuple[str, ...] = ()  # later user turns, for --turns all

    @property
    def turns(self) -> tuple[str, ...]:
        return (self.text, *self.follow_ups)


UNCATEGORISED = "uncategorised"

_SNIPPETS = {
    "stats": """def mean(values):
    total = 0
    for v in values:
        total += v
    return total / len(values)


def variance(values):
    m = mean(values)
    total = 0
    for v in values:
        total += (v - m) ** 2
    return total / len(values)


def describe(values):
    return {"mean": mean(values), "variance": variance(values), "count": len(values)}
""",
    "inventory": """class Inventory:
    def __init__(self):
        self.items = {}

    def add(self, name, count):
        self.items[name] = self.items.get(name, 0) + count

    def remove(self, name, count):
        if self.items.get(name, 0) < count:
            raise ValueError("not enough " + name)
        self.items[name] -= count

    def total(self):
        return sum(self.items.values())
""",
    "http": """import json
import urllib.request


def fetch_json(url, timeout=10):
    with urllib.request.urlopen(url, timeout=timeout) as response:
        data = response.read()
    return json.loads(data)


def fetch_user(base_url, user_id):
    return fetch_json(base_url + "/users/" + str(user_id))


def fetch_posts(base_url, user_id):
    return fetch_json(base_url + "/users/" + str(user_id) + "/posts")
""",
    "matrix": """def transpose(matrix):
    rows = len(matrix)
    cols = len(matrix[0])
    result = [[0] * rows for _ in range(cols)]
    for i in range(rows):
        for j in range(cols):
            result[j][i] = matrix[i][j]
    return result


def multiply(a, b):
    result = [[0] * len(b[0]) for _ in range(len(a))]
    for i in range(len(a)):
        for j in range(len(b[0])):
            for k in range(len(b)):
                result[i][j] += a[i][k] * b[k][j]
    return result
""",
}

CODE_EDIT = [
    Prompt(
        f"Rename the function `mean` to `average` everywhere in this code and reply with the complete updated "
        f"code only.\n\n```python\n{_SNIPPETS['stats']}```",
        id="rename-mean",
    ),
    Prompt(
        f"Rename the method `total` to `count_all` and reply with the full class, nothing else.\n\n"
        f"```python\n{_SNIPPETS['inventory']}```",
        id="rename-method",
    ),
    Prompt(
        f"Change the default timeout from 10 to 30 seconds and reply with the whole file.\n\n"
        f"```python\n{_SNIPPETS['http']}```",
        id="change-default",
    ),
    Prompt(
        f"Rename the variable `result` to `out` in both functions and return the full code.\n\n"
        f"```python\n{_SNIPPETS['matrix']}```",
        id="rename-variable",
    ),
    Prompt(
        f"Add type hints (list[float] -> float) to every function and reply with the complete code.\n\n"
        f"```python\n{_SNIPPETS['stats']}```",
        id="type-hints",
    ),
    Prompt(
        f"Fix the bug: `remove` should delete the key when the count reaches zero. Reply with the full class."
        f"\n\n```python\n{_SNIPPETS['inventory']}```",
        id="fix-bug",
    ),
]

CODE = [
    Prompt(
        "Write a Python function that checks whether a string is a palindrome, ignoring case and spaces.",
        id="palindrome",
    ),
    Prompt(
        "Write a Python function `fizzbuzz(n)` that returns the FizzBuzz sequence from 1 to n as a list.", id="fizzbuzz"
    ),
    Prompt("Write a Python class `Stack` with push, pop, peek and is_empty methods.", id="stack"),
    Prompt("Write a Python function that returns the n-th Fibonacci number iteratively.", id="fibonacci"),
    Prompt(
        "Write a Python function that counts the words in a text file and returns the 10 most common.", id="wordcount"
    ),
    Prompt("Write a binary search function in Python that returns the index of a target or -1.", id="bsearch"),
]

CHAT = [
    Prompt("What is the capital of France, and what is it famous for?", id="france"),
    Prompt("Give me three tips for sleeping better.", id="sleep"),
    Prompt("Explain what a neural network is to a ten-year-old.", id="nn"),
    Prompt("What are the main differences between tea and coffee?", id="tea"),
    Prompt("How do plants make their food?", id="plants"),
    Prompt("Write a short poem about the ocean.", id="poem"),
]

SUMMARIZATION = [
    Prompt(
        "Summarize in two sentences: The Python programming language was created by Guido van Rossum and first "
        "released in 1991. Python emphasizes code readability with significant indentation. It supports multiple "
        "programming paradigms, including structured, object-oriented and functional programming. Python is often "
        "described as a batteries included language because of its comprehensive standard library.",
        id="python",
    ),
    Prompt(
        "Summarize: Speculative decoding speeds up text generation from large language models. A small draft "
        "model proposes several tokens, and the large target model checks all of them in a single forward pass. "
        "Tokens that agree with the target are kept, so the output is exactly what the target would produce, but "
        "fewer slow target steps are needed when the draft is often right.",
        id="specdec",
    ),
    Prompt(
        "Summarize in one sentence: The Amazon rainforest covers much of the Amazon basin of South America. The "
        "majority of the forest is contained within Brazil, with smaller parts in Peru, Colombia and other "
        "countries. It represents over half of the planet's remaining rainforests and is the largest and most "
        "biodiverse tract of tropical rainforest in the world.",
        id="amazon",
    ),
    Prompt(
        "Summarize the key points: Regular exercise improves cardiovascular health, strengthens muscles and "
        "bones, and helps control weight. It also reduces the risk of chronic diseases such as diabetes, and it "
        "improves mood and sleep quality. Experts recommend at least 150 minutes of moderate activity per week.",
        id="exercise",
    ),
]

AGENTIC_DATA = "agentic.json"  # in trt_spec/harness/data/; never used to tune anything (data/README.md)


def agentic_turns(file: str, edits: Sequence[str], doc: dict) -> tuple[str, ...]:
    """An agentic conversation's user turns: the file and the first edit, then each further edit alone (the history
    carries the file and the model's own answers)."""
    return (
        doc["first_turn"].format(file=file, edit=edits[0]),
        *(doc["later_turn"].format(edit=e) for e in edits[1:]),
    )


def agentic_conversations() -> list[Prompt]:
    """The shipped agentic set: one Prompt per conversation, its later turns as follow_ups."""
    doc = json.loads(resources.files(__package__).joinpath("data", AGENTIC_DATA).read_text(encoding="utf-8"))
    out = []
    for c in doc["conversations"]:
        first, *later = agentic_turns(c["file"], c["edits"], doc)
        out.append(Prompt(first, c["max_tokens"], c["id"], follow_ups=tuple(later)))
    return out


PROMPT_SETS: dict[str, list[Prompt]] = {
    "code-edit": CODE_EDIT,
    "code": CODE,
    "chat": CHAT,
    "summarization": SUMMARIZATION,
    "agentic": agentic_conversations(),
}
MULTI_TURN_SETS = ("agentic",)  # shipped sets whose bench runs every turn unless --turns first


def default_turns(prompt_set: str) -> str:
    """bench's --turns when not given: every turn for a multi-turn shipped set, else the first."""
    return "all" if prompt_set in MULTI_TURN_SETS else defaults.TURNS


# JSONL field names written by trt-spec, vLLM bench and AIPerf
PROMPT_KEYS = ("prompt", "text")
LENGTH_KEYS = ("max_tokens", "output_length", "output_tokens")
SHAREGPT_HUMAN = ("human", "user")
SHAREGPT_ANSWER = ("gpt", "assistant", "chatgpt")
CHARS_PER_TOKEN = 4  # OpenAI's rule of thumb, for ShareGPT answer lengths


def load_prompts(name_or_path: str, max_tokens: int | None = None) -> list[Prompt]:
    """A shipped set by name, a JSONL file (prompt rows or Spec-Bench rows) or a ShareGPT JSON list (first human turns).

    ShareGPT max_tokens is the following answer's length / CHARS_PER_TOKEN."""
    if name_or_path in PROMPT_SETS:
        prompts = [replace(p, category=name_or_path) for p in PROMPT_SETS[name_or_path]]
    else:
        p = Path(name_or_path)
        if not p.is_file():
            raise ValueError(f"prompt set {name_or_path!r}: not one of {', '.join(PROMPT_SETS)} and not a file")
        text = p.read_text()
        prompts = _sharegpt(p, text) if text.lstrip().startswith("[") else _jsonl(p, text)
        if not prompts:
            raise ValueError(f"{p}: no prompts in it")
    if max_tokens is not None:
        prompts = [replace(p, max_tokens=max_tokens) for p in prompts]
    return list(prompts)


def select_prompts(prompts: Sequence[Prompt], categories: Sequence[str]) -> list[Prompt]:
    """The prompts of these categories (all when none); ValueError for a category not present."""
    if not categories:
        return list(prompts)
    present = list(dict.fromkeys(p.category for p in prompts if p.category))
    unknown = [c for c in categories if c not in present]
    if unknown:
        have = ", ".join(present) if present else "none (a shipped set's is its name; a Spec-Bench row's its category)"
        raise ValueError(f"--category {', '.join(unknown)}: no such category in these prompts; they have: {have}")
    return [p for p in prompts if p.category in categories]


def _jsonl(p: Path, text: str) -> list[Prompt]:
    prompts = []
    for i, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
            if isinstance(obj, dict) and "turns" in obj:  # Spec-Bench
                prompts.append(_spec_bench_row(p, i, obj))
                continue
            key = next(k for k in PROMPT_KEYS if k in obj)
            prompt = obj[key]
        except (json.JSONDecodeError, StopIteration, TypeError):
            raise ValueError(
                f'{p}:{i}: expected a JSON object with a "prompt" key (or "text", or Spec-Bench\'s "turns")'
            ) from None
        if not isinstance(prompt, str) or not prompt:
            raise ValueError(f'{p}:{i}: "{key}" must be a non-empty string')
        mt = next((obj[k] for k in LENGTH_KEYS if k in obj), DEFAULT_MAX_TOKENS)
        if not isinstance(mt, int) or isinstance(mt, bool) or mt < 1:
            raise ValueError(f"{p}:{i}: the output length must be a positive integer, got {mt!r}")
        prompts.append(Prompt(prompt, mt, str(obj.get("id", i))))
    return prompts


def _spec_bench_row(p: Path, i: int, obj: dict) -> Prompt:
    turns, category = obj["turns"], obj.get("category", "")
    if not isinstance(turns, list) or not turns or not all(isinstance(t, str) and t for t in turns):
        raise ValueError(f'{p}:{i}: "turns" must be a non-empty list of non-empty strings (Spec-Bench\'s schema)')
    if not isinstance(category, str):
        raise ValueError(f'{p}:{i}: "category" must be a string, got {category!r}')
    return Prompt(turns[0], DEFAULT_MAX_TOKENS, str(obj.get("question_id", i)), category, tuple(turns[1:]))


def _sharegpt(p: Path, text: str) -> list[Prompt]:
    try:
        rows = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(
            f"{p}: not valid JSON ({e.msg} at line {e.lineno}); a ShareGPT file is one JSON list"
        ) from None
    if not isinstance(rows, list):
        raise ValueError(f'{p}: a ShareGPT file is a JSON list of {{"conversations": [...]}}')
    prompts = []
    for i, row in enumerate(rows):
        turns = row.get("conversations") if isinstance(row, dict) else None
        if not isinstance(turns, list):
            raise ValueError(f'{p}: entry {i} has no "conversations" list')
        for j, t in enumerate(turns):
            if (
                isinstance(t, dict)
                and t.get("from") in SHAREGPT_HUMAN
                and isinstance(t.get("value"), str)
                and t["value"]
            ):
                answer = turns[j + 1] if j + 1 < len(turns) else {}
                length = len(answer.get("value", "")) if answer.get("from") in SHAREGPT_ANSWER else 0
                prompts.append(
                    Prompt(
                        t["value"],
                        max(1, length // CHARS_PER_TOKEN) if length else DEFAULT_MAX_TOKENS,
                        str(row.get("id", i)),
                    )
                )
                break
    return prompts


TURNS = ("first", "all")  # --turns
NEEDS_TEMPLATE = (
    "--turns all sends each question as a conversation (turn 1, the model's answer, turn 2, ...), which only a chat "
    "template can express; {why}, or use --turns first"
)


def conversation(turns: Sequence[str], answers: Sequence[str]) -> list[dict]:
    """Messages for turn len(answers) + 1: each earlier turn followed by the model's own answer (MT-Bench style)."""
    if not len(answers) < len(turns):
        raise ValueError(f"turn {len(answers) + 1} of a {len(turns)}-turn conversation does not exist")
    msgs = []
    for user, answer in zip(turns, answers):
        msgs += [{"role": "user", "content": user}, {"role": "assistant", "content": answer}]
    return msgs + [{"role": "user", "content": turns[len(answers)]}]


def render_conversation(tokenizer, messages: list[dict]) -> str:
    """A conversation in the chat template, with the assistant turn opened."""
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def with_chat_template(prompts: list[Prompt], tokenizer) -> list[Prompt]:
    """Wrap each prompt as a user turn in the chat template; unchanged without one."""
    if not getattr(tokenizer, "chat_template", None):
        return list(prompts)
    return [
        Prompt(
            render_conversation(tokenizer, [{"role": "user", "content": p.text}]),
            p.max_tokens,
            p.id,
            p.category,
        )
        for p in prompts
    ]
