"""The held-out code-edit prompt set (tests/data/code_edit_heldout.jsonl): never used to choose defaults."""

from __future__ import annotations

from pathlib import Path

from trt_spec.harness.prompts import PROMPT_SETS, load_prompts

HELDOUT = Path(__file__).resolve().parents[1] / "data" / "code_edit_heldout.jsonl"


def _lines(text: str) -> set[str]:
    # Lines long enough to identify a snippet or a task ("return result" alone does not).
    return {s for s in (line.strip() for line in text.splitlines()) if len(s) >= 16}


def test_heldout_set_loads_through_the_cli_path():
    prompts = load_prompts(str(HELDOUT))
    assert 8 <= len(prompts) <= 12
    assert len({p.id for p in prompts}) == len(prompts)
    assert all(p.max_tokens == 128 and "```python\n" in p.text for p in prompts)


def test_heldout_set_shares_no_prompt_or_snippet_with_the_shipped_sets():
    held = load_prompts(str(HELDOUT))
    shipped = [p for prompts in PROMPT_SETS.values() for p in prompts]
    shipped_texts = {p.text for p in shipped}
    shipped_lines = set().union(*(_lines(p.text) for p in shipped))
    for p in held:
        assert p.text not in shipped_texts, p.id
        assert not (_lines(p.text) & shipped_lines), (p.id, _lines(p.text) & shipped_lines)
