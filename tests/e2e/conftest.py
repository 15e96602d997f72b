"""End-to-end fixtures: a tiny reference-engine deployment built with trt-spec and served by a real
tritonserver (the binary bundled in nvidia-pytriton)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from trt_spec.config import load_config
from trt_spec.plan import make_plan
from trt_spec.preflight import run_preflight
from trt_spec.repository import write_repository
from trt_spec.runner import load_manifest, run_plan
from trt_spec.server import TritonServer, free_port

from ..tiny import make_model, make_tokenizer


def build_deployment(root: Path, mode: str, draft_dir: Path | None, target_dir: Path, k: int = 4) -> Path:
    cfg = {"engine": "reference", "target": {"checkpoint": str(target_dir)},
           "quantization": {"weights": "fp32"},
           "speculative": {"mode": mode, "max_draft_len": k, "ngram_size": 3},
           "limits": {"max_batch_size": 4, "max_input_len": 384, "max_seq_len": 512, "max_num_tokens": 512},
           "output_dir": str(root / "build")}
    if draft_dir is not None:
        cfg["draft"] = {"checkpoint": str(draft_dir)}
    path = root / f"{mode}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    c = load_config(path)
    run_plan(make_plan(c, run_preflight(c, None, require_checkpoints=True), path), config_path=path)
    repo = root / "repo"
    write_repository(load_manifest(root / "build"), repo)
    return repo


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    tok = make_tokenizer(root / "tok")
    target = make_model(root / "target", tok, seed=0)
    return {"tokenizer": tok, "target": target,
            "draft_copy": make_model(root / "draft_copy", tok, copy_from=target),
            "draft_other": make_model(root / "draft_other", tok, seed=1)}


def _serve(repo: Path, log: Path):
    server = TritonServer(repo, http_port=free_port(), grpc_port=free_port(), metrics_port=free_port(), log_path=log)
    server.start().wait_ready(180)
    return server


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
