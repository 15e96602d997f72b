"""End-to-end fixtures: a tiny reference-engine deployment built with trt-spec and served by a real
tritonserver (the binary bundled in nvidia-pytriton)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from trt_spec.builder.plan import make_plan
from trt_spec.builder.preflight import run_preflight
from trt_spec.builder.runner import run_plan
from trt_spec.harness import client
from trt_spec.records.config import load_config
from trt_spec.records.manifest import BuildManifest
from trt_spec.repository.writer import write_repository
from trt_spec.serve.server import TritonServer, free_port

from ..tiny import make_model, make_tokenizer


def build_deployment(
    root: Path, mode: str, draft_dir: Path | None, target_dir: Path, k: int = 4, speculative: dict | None = None
) -> Path:
    cfg = {
        "engine": "reference",
        "target": {"checkpoint": str(target_dir)},
        "quantization": {"weights": "fp32"},
        "speculative": {
            "mode": mode,
            "max_draft_len": k,
            **({"ngram_size": 3} if mode == "ngram" else {}),
            **(speculative or {}),
        },
        "limits": {"max_batch_size": 4, "max_input_len": 384, "max_seq_len": 512, "max_num_tokens": 512},
        "output_dir": str(root / "build"),
    }
    if draft_dir is not None:
        cfg["draft"] = {"checkpoint": str(draft_dir)}
    path = root / f"{mode}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    c = load_config(path)
    run_plan(make_plan(c, run_preflight(c, None, require_checkpoints=True), path), config_path=path)
    repo = root / "repo"
    write_repository(BuildManifest.read(root / "build"), repo)
    return repo


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    tok = make_tokenizer(root / "tok")
    target = make_model(root / "target", tok, seed=0)
    return {
        "tokenizer": tok,
        "target": target,
        "draft_copy": make_model(root / "draft_copy", tok, copy_from=target),
        "draft_other": make_model(root / "draft_other", tok, seed=1),
    }


@pytest.fixture(autouse=True, scope="session")
def short_client_timeout():
    """Requests on the tiny test models answer in seconds: a response that takes 2 minutes means the server is
    stuck, and the test should fail then (with the server log), not after the product's 10-minute default."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(client, "REQUEST_TIMEOUT_S", 120.0)
        yield


SERVERS: list[TritonServer] = []  # every server this session started: their logs explain a failed test


def _serve(repo: Path, log: Path):
    server = TritonServer(repo, http_port=free_port(), grpc_port=free_port(), metrics_port=free_port(), log_path=log)
    SERVERS.append(server)
    server.start().wait_ready(180)
    return server


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A failed (or timed-out) end-to-end test carries the tail of every running server's log in its report,
    so a CI log shows what the server was doing, not only that the client gave up."""
    outcome = yield
    report = outcome.get_result()
    if report.failed:
        for server in SERVERS:
            report.sections.append((f"tritonserver log tail ({server.log_path})", server.log_tail(60)))


@pytest.fixture(scope="session")
def dtm_server(tiny_models, tmp_path_factory):
    """Draft-target deployment whose draft is a different random model (partial/low acceptance)."""
    root = tmp_path_factory.mktemp("dtm")
    repo = build_deployment(root, "draft_target", tiny_models["draft_other"], tiny_models["target"])
    server = _serve(repo, root / "server.log")
    yield server
    server.stop()


@pytest.fixture(scope="session")
def ngram_server(tiny_models, tmp_path_factory):
    root = tmp_path_factory.mktemp("ngram")
    repo = build_deployment(root, "ngram", None, tiny_models["target"])
    server = _serve(repo, root / "server.log")
    yield server
    server.stop()


@pytest.fixture(scope="session")
def eagle_server(tiny_models, tmp_path_factory):
    """EAGLE in the engine: a head trained at build time (a short run on the tiny target) inside the target engine,
    and the baseline engine beside it."""
    root = tmp_path_factory.mktemp("eagle")
    # fixed chains: the engine drafts every step whatever a loaded machine measures its costs to be at load (the
    # confidence policy, a unit-tested choice, may decide drafting does not pay there and draft nothing)
    repo = build_deployment(
        root,
        "eagle",
        None,
        tiny_models["target"],
        speculative={"draft_len_policy": "fixed", "eagle": {"train": {"steps": 40, "prompts": 32, "draft_vocab": 256}}},
    )
    server = _serve(repo, root / "server.log")
    yield server
    server.stop()
