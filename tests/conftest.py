"""Shared fixtures: the farm of tiny deployments and shared servers (tests/farm.py), tiny checkpoints (config.json +
tokenizer.json) and stand-in TensorRT-LLM tools."""

from __future__ import annotations

import atexit
import json
import os
import shutil
import stat
import sys
import tempfile
import threading
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
BUILD_CONFIGS = sorted((REPO / "build_configs").glob("*.yaml"))

# trt-spec's cache (served admin keys by port, the plain command's backend directory): the session's own, never the
# user's (subprocesses inherit it)
_CACHE = tempfile.mkdtemp(prefix="trt-spec-test-cache-")
os.environ["TRT_SPEC_CACHE_DIR"] = _CACHE
atexit.register(shutil.rmtree, _CACHE, True)


def make_checkpoint(
    d: Path,
    *,
    arch: str = "LlamaForCausalLM",
    vocab_size: int = 64,
    layers: int = 2,
    hidden: int = 64,
    heads: int = 4,
    kv_heads: int = 2,
    tokens: list[str] | None = None,
    bos: int = 1,
    eos=2,
    max_pos: int = 4096,
    tie: bool = True,
) -> Path:
    """A checkpoint directory as preflight sees it: config.json and a fast-tokenizer tokenizer.json."""
    d.mkdir(parents=True, exist_ok=True)
    cfg = {
        "architectures": [arch],
        "hidden_size": hidden,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "num_hidden_layers": layers,
        "intermediate_size": hidden * 2,
        "vocab_size": vocab_size,
        "tie_word_embeddings": tie,
        "max_position_embeddings": max_pos,
        "bos_token_id": bos,
        "eos_token_id": eos,
    }
    (d / "config.json").write_text(json.dumps(cfg))
    tokens = tokens if tokens is not None else [f"tok{i}" for i in range(min(vocab_size, 60))]
    tok = {
        "model": {"type": "BPE", "vocab": {t: i for i, t in enumerate(tokens)}, "merges": []},
        "added_tokens": [{"id": 0, "content": "<pad>"}, {"id": 1, "content": "<s>"}, {"id": 2, "content": "</s>"}],
    }
    (d / "tokenizer.json").write_text(json.dumps(tok))
    return d


FAKE_TOOL = r'''#!{python}
"""Stand-in for {tool}: records its argv, honours FAKE_FAIL / FAKE_SLEEP, writes --output_dir."""
import json, os, sys, time
argv = sys.argv[1:]
log = os.environ.get("FAKE_TOOL_LOG")
if log:
    with open(log, "a") as f:
        f.write(json.dumps({{"tool": "{tool}", "argv": argv}}) + "\n")
out = argv[argv.index("--output_dir") + 1]
os.makedirs(out, exist_ok=True)
with open(os.path.join(out, "partial.txt"), "w") as f:
    f.write("started")
if os.environ.get("FAKE_SLEEP_MARK"):
    open(os.environ["FAKE_SLEEP_MARK"], "w").close()
time.sleep(float(os.environ.get("FAKE_SLEEP", "0")))
fail = os.environ.get("FAKE_FAIL", "")
if fail and fail in out:
    print("fake failure: out of memory while building", file=sys.stderr)
    sys.exit(3)
with open(os.path.join(out, "config.json"), "w") as f:
    json.dump({{"tool": "{tool}", "argv": argv}}, f)
print("fake {tool} done")
'''


def write_fake_tools(root: Path) -> dict:
    """examples/quantization/quantize.py, examples/models/core/llama/convert_checkpoint.py, bin/trtllm-build."""
    paths = {
        "quantize": root / "examples" / "quantization" / "quantize.py",
        "convert": root / "examples" / "models" / "core" / "llama" / "convert_checkpoint.py",
        "trtllm_build": root / "bin" / "trtllm-build",
    }
    for name, p in paths.items():
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(FAKE_TOOL.format(python=sys.executable, tool=name))
        p.chmod(p.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return {
        "examples_dir": str(root / "examples"),
        "trtllm_build": str(paths["trtllm_build"]),
        "python": sys.executable,
    }


@pytest.fixture
def tiny_pair(tmp_path: Path) -> tuple[Path, Path]:
    return (
        make_checkpoint(tmp_path / "target", layers=4, hidden=128),
        make_checkpoint(tmp_path / "draft", layers=2, hidden=64),
    )


@pytest.fixture
def fake_build(tmp_path: Path, tiny_pair, monkeypatch) -> dict:
    """A draft-target tensorrt config over tiny checkpoints with stand-in tools; returns paths."""
    tools = write_fake_tools(tmp_path / "tools")
    target, draft = tiny_pair
    out = tmp_path / "out"
    cfg = {
        "engine": "tensorrt",
        "gpu": "h100:1",
        "target": {"checkpoint": str(target)},
        "draft": {"checkpoint": str(draft)},
        "speculative": {"mode": "draft_target", "max_draft_len": 4},
        "limits": {"max_batch_size": 2, "max_input_len": 256, "max_seq_len": 512, "max_num_tokens": 512},
        "toolchain": tools,
        "output_dir": str(out),
    }
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(cfg))
    log = tmp_path / "tool-calls.jsonl"
    monkeypatch.setenv("FAKE_TOOL_LOG", str(log))
    return {"config": path, "out": out, "log": log, "tmp": tmp_path}


def tool_calls(log: Path) -> list[dict]:
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text().splitlines() if line.strip()]


@pytest.fixture(autouse=True)
def _no_env_overrides(monkeypatch):
    for k in list(os.environ):
        if k.startswith("TRT_SPEC__"):
            monkeypatch.delenv(k)


# -- the farm (tests/farm.py): tiny deployments built once, servers started once, for the whole session -------------


@pytest.fixture(scope="session")
def farm(tmp_path_factory):
    from .farm import Farm

    f = Farm(tmp_path_factory.mktemp("farm"))
    FARMS.append(f)
    yield f
    f.close()


FARMS: list = []  # the session's farm: its servers' logs explain a failed test


@pytest.fixture(scope="session")
def tiny_models(farm):
    return farm.models()


@pytest.fixture(scope="session")
def dtm_server(farm):
    """Draft-target (k 5) whose draft is a different random model (partial/low acceptance), decoupled."""
    return farm.server("dtm")


@pytest.fixture(scope="session")
def unary_server(farm):
    """The --no-decoupled repository (NVIDIA's DTM recipe) of the same draft-target build."""
    return farm.server("dtm_unary")


@pytest.fixture(scope="session")
def ngram_server(farm):
    """N-gram over the tiny target whose tokenizer has a chat template."""
    return farm.server("ngram")


@pytest.fixture(scope="session")
def eagle_server(farm):
    """EAGLE in the engine: a head trained at build time inside the target engine, the baseline engine beside it."""
    return farm.server("eagle")


@pytest.fixture(scope="session")
def llmapi_server(farm):
    return farm.server("llmapi")


@pytest.fixture(scope="session")
def faulty_server(farm):
    """A draft-target repository with an engine queue of farm.MAX_QUEUE and a BLS that accepts drafts unverified."""
    return farm.server("faulty")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A failed (or timed-out) test carries the tail of every running farm server's log in its report, so a CI log
    shows what the server was doing, not only that the client gave up."""
    outcome = yield
    report = outcome.get_result()
    if report.failed:
        for f in FARMS:
            for server in f.servers.values():
                report.sections.append((f"tritonserver log tail ({server.log_path})", server.log_tail(60)))


# -- how many tritonservers the session started (the farm's and every test's own), in the summary -------------------

_STARTS: list[int] = []
_POLLING = threading.Event()


def _is_tritonserver(pid: str) -> bool:
    return os.path.basename(os.readlink(f"/proc/{pid}/exe")) == "tritonserver"


def _parent(pid: str) -> str:
    stat = open(f"/proc/{pid}/stat").read()
    return stat[stat.rindex(")") + 2 :].split()[1]


def _count_tritonservers() -> None:
    """Polls /proc; a process is watched for 3 s after it appears (a fork becomes tritonserver at its exec)."""
    import time

    first: dict = {}  # pid -> when first seen; None once counted or past watching
    while not _POLLING.wait(0.2):
        now = time.monotonic()
        for pid in os.listdir("/proc"):
            if not pid.isdigit() or first.get(pid, now) is None:
                continue
            since = first.setdefault(pid, now)
            try:  # the binary, not a stand-in script of that name, nor its fork about to exec a backend stub
                if _is_tritonserver(pid) and not _is_tritonserver(_parent(pid)):
                    _STARTS.append(int(pid))
                    first[pid] = None
                    continue
            except OSError:
                pass
            if now - since > 3:
                first[pid] = None


def pytest_configure(config):
    if sys.platform.startswith("linux"):
        threading.Thread(target=_count_tritonservers, daemon=True).start()


def pytest_terminal_summary(terminalreporter):
    _POLLING.set()
    farm = sum(len(f.servers) for f in FARMS)
    terminalreporter.write_line(f"tritonserver starts: {len(_STARTS)} ({farm} shared by the farm)")
