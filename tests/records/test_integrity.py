"""Engine integrity: checksums recorded by the build, verified by the runner, the repository writer and the
engine model at load; and a byte-reproducible reference export (so the sums are stable across rebuilds)."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import pytest
import yaml

from trt_spec.builder.plan import STEP_STAMP, make_plan
from trt_spec.builder.preflight import run_preflight
from trt_spec.builder.runner import is_up_to_date, run_plan
from trt_spec.records.config import load_config
from trt_spec.records.integrity import IntegrityError, file_sums, verify, verify_served_engine
from trt_spec.records.manifest import BuildManifest, RepoRecord
from trt_spec.reference.export import export, save_safetensors
from trt_spec.repository.writer import RepositoryError, write_repository

from ..tiny import make_model, make_tokenizer


@pytest.fixture(scope="module")
def tiny_target(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("models")
    return make_model(root / "target", make_tokenizer(root / "tok"))


@pytest.fixture(scope="module")
def built(tiny_target, tmp_path_factory) -> dict:
    """A built n-gram reference deployment (one step: export-target, FP8). Tests restore what they corrupt."""
    root = tmp_path_factory.mktemp("build")
    cfg = {
        "engine": "reference",
        "target": {"checkpoint": str(tiny_target)},
        "quantization": {"weights": "fp8"},
        "speculative": {"mode": "ngram", "max_draft_len": 4, "ngram_size": 3},
        "limits": {"max_batch_size": 2, "max_input_len": 128, "max_seq_len": 256, "max_num_tokens": 256},
        "output_dir": str(root / "build"),
    }
    path = root / "ngram.yaml"
    path.write_text(yaml.safe_dump(cfg))
    plan = make_plan(load_config(path), run_preflight(load_config(path), None, require_checkpoints=True), path)
    run_plan(plan, config_path=path)
    return {"config": path, "plan": plan, "build": root / "build", "engine": Path(plan.engines["target"]), "root": root}


def plan_of(built):
    c = load_config(built["config"])
    return make_plan(c, run_preflight(c, None, require_checkpoints=True), built["config"])


@contextmanager
def corrupted(f: Path, how: str):
    """Truncate `f` or flip bytes in its middle (same size); restore its bytes afterwards."""
    original = f.read_bytes()
    try:
        if how == "truncate":
            f.write_bytes(original[: len(original) // 2])
        else:
            mid = len(original) // 2
            f.write_bytes(original[:mid] + bytes(b ^ 0xFF for b in original[mid : mid + 4]) + original[mid + 4 :])
        yield
    finally:
        f.write_bytes(original)


def test_stamp_and_manifest_carry_the_sums(built):
    stamp = json.loads((built["engine"] / STEP_STAMP).read_text())
    assert stamp["files"] == file_sums(built["engine"], skip={STEP_STAMP})
    assert "model.safetensors" in stamp["files"] and STEP_STAMP not in stamp["files"]
    entry = BuildManifest.read(built["build"]).target
    assert entry.files == stamp["files"] and entry.step == "export-target"


def test_truncated_engine_file_reruns_its_step(built):
    """Through the CLI: the changed file is named on one line and its step runs again (not "up to date")."""
    f = built["engine"] / "model.safetensors"
    before = BuildManifest.read(built["build"]).target.files
    size = before["model.safetensors"]["size"]
    with corrupted(f, "truncate"):
        r = subprocess.run(
            [sys.executable, "-m", "trt_spec.cli", "build", str(built["config"])],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert r.returncode == 0, r.stderr
        assert "up to date" not in r.stderr and "1 step(s) ran" in r.stdout
        lines = [ln for ln in r.stderr.splitlines() if "does not match the build" in ln]
        assert lines == [
            f"step export-target: output file {f} does not match the build (size {size // 2} != {size} "
            "at build time); rerunning the step"
        ]
        assert f.stat().st_size == size  # rebuilt
    # the reference export is byte-reproducible: the rebuilt engine has the same sums
    assert BuildManifest.read(built["build"]).target.files == before


def test_same_size_corruption_is_detected(built, caplog):
    f = built["engine"] / "model.safetensors"
    step = plan_of(built).step("export-target")
    assert is_up_to_date(step)
    with corrupted(f, "flip"), caplog.at_level(logging.WARNING, logger="trt_spec.builder.runner"):
        assert not is_up_to_date(step)
        assert "same size, sha256" in caplog.text and str(f) in caplog.text
        assert [s.status for s in run_plan(plan_of(built), dry_run=True).steps] == ["would-run"]
    assert is_up_to_date(step)


def test_write_repository_refuses_a_changed_engine(built):
    f = built["engine"] / "model.safetensors"
    manifest = BuildManifest.read(built["build"])
    dest = built["root"] / "repo-refused"
    with corrupted(f, "flip"), pytest.raises(RepositoryError) as e:
        write_repository(manifest, dest)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"engine file {f} does not match the build (same size, sha256 ")
    assert f"trt-spec build {built['config']} --force --only export-target" in msg
    assert not dest.exists()  # nothing written


def test_cli_repo_shows_the_one_line(built):
    f = built["engine"] / "config.json"
    with corrupted(f, "truncate"):
        r = subprocess.run(
            [
                sys.executable,
                "-m",
                "trt_spec.cli",
                "repo",
                str(built["build"]),
                "--out",
                str(built["root"] / "repo-cli"),
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        f"error: engine file {f} does not match the build (size {len(f.read_bytes()) // 2} != {f.stat().st_size} "
        f"at build time); rebuild it: trt-spec build {built['config']} --force --only export-target, then rerun "
        "trt-spec repo"
    ]


def test_engine_model_refuses_to_load_a_changed_engine(built):
    """The check model_repo/reference_engine/1/model.py runs in initialize() (the model fails to load)."""
    repo = built["root"] / "repo"
    write_repository(BuildManifest.read(built["build"]), repo)
    record = RepoRecord.read(repo)
    assert record.engines[str(built["engine"])].files["model.safetensors"]["size"] > 0
    verify_served_engine(repo, str(built["engine"]))  # intact: loads
    f = built["engine"] / "model.safetensors"
    with (
        corrupted(f, "truncate"),
        pytest.raises(
            IntegrityError,
            match=rf"engine file {f} does not match the build "
            r"\(size \d+ != \d+ at build time\); rebuild it: .*--force --only "
            r"export-target",
        ),
    ):
        verify_served_engine(repo, str(built["engine"]))
    verify_served_engine(repo, "/some/other/engine")  # no recorded sums for it: not checked


def test_engine_model_initialize_runs_the_check(built, monkeypatch):
    """The written tensorrt_llm model (python backend, stubbed pb_utils) fails to load on a changed engine."""
    import importlib.util
    import types

    from google.protobuf.json_format import MessageToDict

    from trt_spec.repository.writer import parse_config

    repo = built["root"] / "repo-model"
    write_repository(BuildManifest.read(built["build"]), repo)
    mdir = repo / "tensorrt_llm"
    monkeypatch.setitem(
        sys.modules,
        "triton_python_backend_utils",
        types.SimpleNamespace(
            TRITONSERVER_RESPONSE_COMPLETE_FINAL=1, Logger=types.SimpleNamespace(log_error=print, log_info=print)
        ),
    )
    spec = importlib.util.spec_from_file_location("reference_engine_model", mdir / "1" / "model.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    cfg = MessageToDict(parse_config(mdir / "config.pbtxt"), preserving_proto_field_name=True)
    args = {
        "model_config": json.dumps(cfg),
        "model_name": "tensorrt_llm",
        "model_repository": str(mdir),
        "model_version": "1",
    }
    with (
        corrupted(built["engine"] / "model.safetensors", "flip"),
        pytest.raises(IntegrityError, match="does not match the build"),
    ):
        module.TritonPythonModel().initialize(args)
    module.TritonPythonModel().initialize(args)  # intact: loads


def test_verify_missing_file_and_sizes_before_hashes(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "a.bin").write_bytes(b"x" * 10)
    (tmp_path / "sub" / "b.bin").write_bytes(b"y" * 3)
    sums = file_sums(tmp_path)
    assert sorted(sums) == ["a.bin", "sub/b.bin"] and sums["a.bin"]["size"] == 10
    verify(tmp_path, sums, "fix")
    (tmp_path / "sub" / "b.bin").write_bytes(b"z" * 3)  # same size, different bytes
    (tmp_path / "a.bin").write_bytes(b"x" * 9)  # a size change is reported first (no hashing needed)
    with pytest.raises(IntegrityError, match=r"a\.bin does not match the build \(size 9 != 10 at build time\); fix"):
        verify(tmp_path, sums, "fix")
    os.remove(tmp_path / "a.bin")
    with pytest.raises(IntegrityError, match=r"a\.bin does not match the build \(missing\)"):
        verify(tmp_path, sums, "fix")


def test_fp8_export_is_byte_reproducible(tiny_target, tmp_path):
    dirs = [tmp_path / f"e{i}" for i in range(3)]
    for d in dirs:
        export(tiny_target, d, "fp8")
    first = file_sums(dirs[0])
    assert "model.safetensors" in first and "trt_spec_engine.json" in first
    for d in dirs[1:]:
        assert file_sums(d) == first


def test_safetensors_header_is_canonical(tmp_path):
    import torch

    meta = {f"k{i}": str(i) for i in range(12)}
    for i in range(3):
        save_safetensors({"b": torch.zeros(2), "a": torch.ones(3)}, tmp_path / f"{i}.safetensors", meta)
    data = [(tmp_path / f"{i}.safetensors").read_bytes() for i in range(3)]
    assert data[0] == data[1] == data[2]
    from safetensors import safe_open

    with safe_open(str(tmp_path / "0.safetensors"), "pt") as f:
        assert f.metadata() == meta and sorted(f.keys()) == ["a", "b"]


def test_cli_serve_refuses_a_changed_engine_before_starting_anything(built):
    """The GPU path's load-time check: the tensorrtllm backend loads engines without looking at sums, so serve
    verifies every engine of the repository first."""
    repo = built["root"] / "repo-serve"
    write_repository(BuildManifest.read(built["build"]), repo)
    f = built["engine"] / "model.safetensors"
    with corrupted(f, "flip"):
        r = subprocess.run(
            [sys.executable, "-m", "trt_spec.cli", "serve", str(repo), "--http-port", "1"],
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip().splitlines()[-1].startswith(f"error: engine file {f} does not match the build")
    assert "plain command" not in r.stderr  # refused before any server process
