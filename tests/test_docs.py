"""README is the front door and docs/ holds the rest; this keeps both honest as the code moves under them.

Every relative link in README.md and docs/*.md must land: the file exists, and a `#anchor` names a heading of the
target by GitHub's slug rules. Every command README shows (its fenced code blocks, and the inline code that starts
with a command) must be one the tools accept: the `trt-spec` subcommand path and each `--option` as the click app
itself defines them, `make` targets from the Makefile, `python -m` modules, and repository paths such as
build_configs/x.yaml or tests/... . README stays short (the topics live in docs/). Each failure names the file, the
line and what is wrong; placeholders (CONFIG, HOST:PORT, `...`, `…`) are not checked.
"""

from __future__ import annotations

import importlib.util
import math
import re
import shlex
from collections import Counter
from pathlib import Path

import click
import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
MAX_README_LINES = 320
PATH_PREFIXES = ("build_configs/", "docs/", "tests/", "benchmarks/", "trt_spec/", "model_repo/")
NOT_COMMANDS = {"text", "yaml", "yml", "json", "python", "py", "promql"}  # fenced blocks of output, data or code
ELLIPSIS = {"...", "…"}


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def scan(path: Path) -> tuple[list[tuple[int, str]], list[tuple[int, str, str]]]:
    """(prose lines, fenced lines with their block's language), each line with its 1-based number."""
    prose, fenced, lang = [], [], None
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if line.lstrip().startswith("```"):
            lang = line.strip()[3:].strip().lower() if lang is None else None
            continue
        if lang is None:
            prose.append((n, line))
        else:
            fenced.append((n, line, lang))
    return prose, fenced


# ---- links and anchors -------------------------------------------------------------------------------------------


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lowercase, punctuation dropped (but - and _), spaces -> -."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    prose, _ = scan(path)
    seen: Counter[str] = Counter()
    found = set()
    for _, line in prose:
        m = re.match(r"#{1,6} (.*)", line)
        if m:
            s = slug(m.group(1))
            found.add(f"{s}-{seen[s]}" if seen[s] else s)  # GitHub numbers repeated headings: x, x-1, x-2
            seen[s] += 1
    return found


def link_errors(path: Path) -> list[str]:
    errors = []
    for n, line in scan(path)[0]:
        text = re.sub(r"`[^`]*`", "", line)  # code spans are not links
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
                continue
            file_part, _, anchor = target.partition("#")
            dest = (path.parent / file_part).resolve() if file_part else path
            where = f"{_rel(path)}:{n}: link ({target})"
            if not dest.exists():
                errors.append(f"{where}: {_rel(dest)} does not exist")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                errors.append(f"{where}: {_rel(dest)} has no heading with the anchor #{anchor}")
    return errors


# ---- commands ----------------------------------------------------------------------------------------------------


def _placeholder(token: str) -> bool:
    """CONFIG, BUILD_DIR|CONFIG, HOST:PORT, NAME:COUNT, k=v, …: shown for the reader to fill in."""
    return bool(re.fullmatch(r"[A-Z][A-Z0-9_]*(?:[|:=][A-Za-z0-9_]*)*|k=v", token)) or any(e in token for e in ELLIPSIS)


def path_errors(token: str) -> list[str]:
    token = token.strip("'\"`").split("=")[-1].split("::")[0].rstrip(".,;:)")
    if not token.startswith(PATH_PREFIXES) or re.search(r"[*{}<>…]|\.\.\.", token):
        return []
    if any(_placeholder(part.split(".")[0]) for part in token.split("/") if part):
        return []  # build_configs/X.yaml, tests/<stage>/...
    return [] if (ROOT / token).exists() else [f"path {token} does not exist in the repository"]


def _tokens(command: str) -> list[str]:
    """Shell words, optional-part brackets dropped: `[--gpu NAME[:COUNT]]` -> --gpu, NAME:COUNT."""
    try:
        words = shlex.split(command, comments=False)
    except ValueError:  # an unbalanced quote in a shortened example
        words = command.split()
    return [w for w in (w.replace("[", "").replace("]", "") for w in words) if w]


def _options(cmd: click.Command) -> dict[str, click.Parameter]:
    opts: dict[str, click.Parameter] = {"--help": None, "-h": None}
    for p in cmd.params:
        if isinstance(p, click.Option):
            opts.update({o: p for o in p.opts + p.secondary_opts})
    return opts


def _arguments(cmd: click.Command) -> float:
    return sum(math.inf if p.nargs < 0 else p.nargs for p in cmd.params if isinstance(p, click.Argument))


def trt_spec_errors(args: list[str]) -> list[str]:
    """The subcommand path exists in the click app, each --option is the command's, positionals fit its arguments."""
    from trt_spec.cli import main

    cmd, path, i = main, ["trt-spec"], 0
    while isinstance(cmd, click.Group) and i < len(args) and args[i] in cmd.commands:
        cmd, path, i = cmd.commands[args[i]], path + [args[i]], i + 1
    if isinstance(cmd, click.Group) and i < len(args) and "|" in args[i]:  # `bench served|openai|in-process`
        return [f"{' '.join(path)} has no subcommand {a!r}" for a in args[i].split("|") if a not in cmd.commands]
    name, opts, positional, errors = " ".join(path), _options(cmd), 0, []
    while i < len(args):
        tok, i = args[i], i + 1
        if tok in ELLIPSIS or tok in {"&", "|"}:
            continue
        if tok.startswith("-") and len(tok) > 1:
            for opt in tok.split("=")[0].split("|"):  # --decoupled|--no-decoupled
                if opt not in opts:
                    errors.append(f"{name} has no option {opt}")
            p = opts.get(tok.split("=")[0].split("|")[0])
            takes_value = p is not None and not (p.is_flag or p.count) and "=" not in tok
            if takes_value and i < len(args) and not args[i].startswith("-"):
                i += 1  # the option's value
            continue
        positional += 1
        if isinstance(cmd, click.Group) and not _placeholder(tok):
            errors.append(f"{name} has no subcommand {tok!r} (it has: {', '.join(sorted(cmd.commands))})")
        elif positional > _arguments(cmd):
            errors.append(
                f"{name} takes no {'further ' if positional > 1 else ''}argument: {tok!r} is not a subcommand of it"
            )
            break  # the words after it would only repeat the error
    return errors


def make_targets() -> set[str]:
    targets = set()
    for line in (ROOT / "Makefile").read_text().splitlines():
        m = re.match(r"([A-Za-z0-9_.%/ -]+):(?!=)", line)
        if m and not line.startswith(("\t", "#")):
            targets.update(m.group(1).split())
    return targets


def segment_errors(segment: str) -> list[str]:
    """Errors of one simple command (no ;, &&, ||, |), named by what is wrong."""
    words = [w for w in _tokens(segment) if w != "$"]
    while words and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=\S*", words[0]):  # VAR=value before the command
        words = words[1:]
    errors = [e for w in words for e in path_errors(w)]
    if not words:
        return errors
    head, args = words[0], words[1:]
    if head == "trt-spec" or head.endswith("/trt-spec"):
        errors += trt_spec_errors(args)
    elif head == "make":
        targets = [a for a in args if not a.startswith("-") and "=" not in a and not _placeholder(a)]
        errors += [f"make target {t!r} is not in the Makefile" for t in targets if t not in make_targets()]
    elif re.fullmatch(r"(?:\S*/)?python3?", head) and args[:1] == ["-m"] and args[1:]:
        errors += [] if importlib.util.find_spec(args[1]) else [f"python -m {args[1]}: no such module"]
    return errors


def command_errors(where: str, line: str) -> list[str]:
    line = re.split(r"\s+#\s", " " + line)[0].strip()  # a trailing comment is not part of the command
    return [
        f"{where}: `{seg.strip()}`: {e}"
        for seg in re.split(r"\s*(?:&&|\|\||;|\s\|\s|\s&(?:\s|$))\s*", line)
        if seg.strip()
        for e in segment_errors(seg)
    ]


def commands_shown(path: Path) -> list[tuple[str, str]]:
    """(file:line, command) of every fenced command line and every inline code span that starts with a command."""
    prose, fenced = scan(path)
    shown, pending = [], ""
    for n, line, lang in fenced:
        if lang in NOT_COMMANDS:
            continue
        pending += line.rstrip("\\") + " "
        if not line.endswith("\\"):  # a continued line ends with a backslash
            shown.append((f"{_rel(path)}:{n}", pending.strip()))
            pending = ""
    for n, line in prose:
        for span in re.findall(r"`([^`]+)`", line):
            if re.match(r"(?:\.venv/bin/)?(?:trt-spec|make|python3? -m)\b", span):
                shown.append((f"{_rel(path)}:{n}", span.replace("\\|", "|")))
    return shown


# ---- the tests ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("path", [README, *DOCS], ids=lambda p: _rel(p))
def test_every_relative_link_lands(path):
    errors = link_errors(path)
    assert not errors, "\n".join(errors)


@pytest.mark.parametrize("path", [README, *DOCS], ids=lambda p: _rel(p))
def test_every_command_shown_is_valid(path):
    errors = [e for where, cmd in commands_shown(path) for e in command_errors(where, cmd)]
    assert not errors, "\n".join(errors)


def test_readme_stays_a_front_door():
    n = len(README.read_text().splitlines())
    assert n <= MAX_README_LINES, f"README.md: {n} lines, more than {MAX_README_LINES}: move the detail into docs/"


def test_every_docs_page_opens_with_a_title_and_what_it_covers():
    for path in DOCS:
        lines = path.read_text().splitlines()
        assert lines[0].startswith("# ") and lines[1] == "" and lines[2].strip(), (
            f"{_rel(path)}:1: start with a one-line H1 title, a blank line, then a sentence saying what it covers"
        )


def test_the_checks_fail_on_what_they_guard(tmp_path):
    """Each check finds the mistake it exists for (and passes a correct command), so a green run means something."""
    assert not command_errors("x:1", "trt-spec build build_configs/cpu-smollm2-ngram.yaml --dry-run --only STEP")
    assert not command_errors("x:1", "make plan CONFIG=build_configs/X.yaml && .venv/bin/python -m pytest -q tests/")
    bad = {
        "trt-spec no-such-command": "has no subcommand 'no-such-command'",
        "trt-spec build CONFIG --no-such-option": "trt-spec build has no option --no-such-option",
        "trt-spec doctor extra": "takes no argument",
        "trt-spec deploy k8s build_configs/no-such.yaml --out DIR": "build_configs/no-such.yaml does not exist",
        "make no-such-target": "make target 'no-such-target' is not in the Makefile",
        "python -m trt_spec.no_such_module": "no such module",
    }
    for cmd, expected in bad.items():
        errors = command_errors("x.md:7", cmd)
        assert any(expected in e and e.startswith("x.md:7: ") for e in errors), (cmd, errors)
    page = tmp_path / "page.md"
    page.write_text("# A page\n\n## Real heading\n[ok](#real-heading) [gone](#no-heading) [missing](nowhere.md)\n")
    errors = link_errors(page)
    assert len(errors) == 2 and all(":4: link" in e for e in errors), errors


def test_the_layout_map_names_every_module():
    """README's layout map is where a newcomer starts: every module of trt_spec/ is named in it, so a new or moved
    module cannot hide from it."""
    text = README.read_text()
    layout = text[text.index("### Layout") : text.index("## Documentation")]
    named = set(re.findall(r"\b(\w+\.py)\b", layout))
    missing = sorted(
        str(p.relative_to(ROOT))
        for p in (ROOT / "trt_spec").rglob("*.py")
        if p.name != "__init__.py" and "__pycache__" not in p.parts and p.name not in named
    )
    assert not missing, f"README.md, Layout: name these modules with what they hold: {missing}"


def test_every_upstream_fact_the_code_names_is_written_down():
    """NVIDIA's and others' behaviour the code relies on lives in docs/upstream-facts.md, once, with its source; the
    code names the fact (`upstream-facts: NAME`), so a name without an entry is a fact with no source."""
    facts = set(
        re.findall(r"^- \*\*([a-z0-9][a-z0-9.-]*)\*\*", (ROOT / "docs" / "upstream-facts.md").read_text(), re.M)
    )
    missing = []
    for f in [*(ROOT / "trt_spec").rglob("*.py"), *(ROOT / "model_repo").rglob("*.py")]:
        for n, line in enumerate(f.read_text().splitlines(), 1):
            for refs in re.findall(r"upstream-facts: ([a-z0-9][a-z0-9.-]*(?:, *[a-z0-9][a-z0-9.-]*)*)", line):
                missing += [f"{_rel(f)}:{n}: {r}" for r in re.split(r", *", refs) if r not in facts]
    assert len(facts) > 50 and not missing, missing
