"""Typed build records (trt_spec/records/manifest.py): manifest.json and trt_spec_repo.json round trip, keep their
field names, and an old, newer, foreign or damaged file is refused with one line naming the file and the fix."""

import dataclasses
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from trt_spec.builder.pipeline import manifest_for_config
from trt_spec.cli import main
from trt_spec.records.deployment import WorldSize
from trt_spec.records.integrity import IntegrityError, verify_repository_engines, verify_served_engine
from trt_spec.records.manifest import (
    MANIFEST_VERSION_KEY,
    REPO_SCHEMA_VERSION,
    REPO_VERSION_KEY,
    SCHEMA_VERSION,
    BuildManifest,
    EngineSums,
    ManifestError,
    RepoRecord,
)
from trt_spec.repository.writer import write_repository

from ..conftest import REPO

GPU_CONFIG = REPO / "build_configs" / "llama33-70b-fp8-h100-tp2.yaml"  # draft + target, TP 2
NGRAM_CONFIG = REPO / "build_configs" / "qwen25-coder-32b-ngram-h100.yaml"  # no draft
# manifest.json's keys (users and scripts read them)
MANIFEST_KEYS = [
    "name",
    "config_path",
    "config_hash",
    "config",
    "engine",
    "created",
    "tool_versions",
    "gpu",
    "deployment",
    "engines",
    "steps",
    "calibration",
]
ENGINE_KEYS = [
    "dir",
    "checkpoint",
    "tp",
    "pp",
    "world_size",
    "devices",
    "weights",
    "kv_cache",
    "argv",
    "fingerprint",
    "max_draft_len",
    "gather_generation_logits",
    "step",
    "files",
]
REPO_KEYS = [
    "name",
    "config_hash",
    "deployment",
    "orchestrator",
    "mpi_ranks",
    "models",
    "decoupled",
    "gpu_ids",
    "engines",
    "load_models",
    "phase_models",
]


@pytest.fixture(scope="module")
def manifest() -> BuildManifest:
    return manifest_for_config(GPU_CONFIG)


def written(tmp_path: Path, data: object) -> Path:
    (tmp_path / "manifest.json").write_text(data if isinstance(data, str) else json.dumps(data))
    return tmp_path


def refusal(build_dir: Path) -> str:
    with pytest.raises(ManifestError) as e:
        BuildManifest.read(build_dir)
    assert "\n" not in str(e.value)
    return str(e.value)


def test_manifest_round_trip_keeps_the_field_names(manifest, tmp_path):
    path = manifest.write(tmp_path)
    data = json.loads(path.read_text())
    assert list(data) == [MANIFEST_VERSION_KEY, *MANIFEST_KEYS] and data[MANIFEST_VERSION_KEY] == SCHEMA_VERSION
    assert list(data["engines"]) == ["target", "draft"] and list(data["engines"]["target"]) == ENGINE_KEYS
    assert data["deployment"]["placement"]["world_size"] == {"target": 2, "draft": 1, "total": 3}
    assert data["config"] == manifest.config.model_dump(mode="json")
    back = BuildManifest.read(tmp_path)
    assert back == manifest and back.to_json() == data
    assert back.config.speculative.mode == "draft_target"
    assert back.target.devices == [0, 1] and back.draft.devices == [0]
    assert back.target.files is None and back.engine_sums() == {}  # planned, not built: no sums yet
    assert [p.name for p in tmp_path.iterdir()] == ["manifest.json"]  # written atomically: no temporary left


def test_manifest_without_a_draft(tmp_path):
    m = manifest_for_config(NGRAM_CONFIG)
    assert m.draft is None and list(m.to_json()["engines"]) == ["target"]
    m.write(tmp_path)
    assert BuildManifest.read(tmp_path) == m


def test_manifest_of_an_older_trt_spec_is_refused(manifest, tmp_path):
    old = {k: v for k, v in manifest.to_json().items() if k != MANIFEST_VERSION_KEY}
    f = written(tmp_path, old) / "manifest.json"
    assert refusal(tmp_path) == (
        f"{f}: build manifest from an older trt-spec (no trt_spec_manifest_version; this trt-spec reads version "
        f"{SCHEMA_VERSION}); rebuild with `trt-spec build {GPU_CONFIG}`"
    )


def test_manifest_of_another_version_is_refused(manifest, tmp_path):
    newer = SCHEMA_VERSION + 1
    f = written(tmp_path, {**manifest.to_json(), MANIFEST_VERSION_KEY: newer}) / "manifest.json"
    assert refusal(tmp_path) == (
        f"{f}: build manifest version {newer}, this trt-spec reads version {SCHEMA_VERSION}; "
        f"rebuild with `trt-spec build {GPU_CONFIG}`"
    )


@pytest.mark.parametrize(
    "content,why",
    [
        ({"model_type": "llama", "hidden_size": 4096}, "no trt_spec_manifest_version field"),
        ([1, 2, 3], "no trt_spec_manifest_version field"),
        ("<html>", "not JSON: Expecting value: line 1 column 1 (char 0)"),
    ],
)
def test_foreign_file_is_refused(tmp_path, content, why):
    f = written(tmp_path, content) / "manifest.json"
    assert refusal(tmp_path) == f"{f}: not a trt-spec build manifest ({why}); rebuild with `trt-spec build CONFIG`"


@pytest.mark.parametrize(
    "damage,why",
    [
        (lambda d: d["engines"]["target"].pop("dir"), "engines.target.dir: missing"),
        (lambda d: d["engines"].pop("target"), "engines.target: missing"),
        (lambda d: d["engines"]["draft"].update(tp="2"), "engines.draft.tp: expected int, got str"),
        (lambda d: d.update(engine="onnx"), "engine: 'onnx' is not one of 'tensorrt', 'reference'"),
        (lambda d: d["config"]["limits"].update(bogus=1), "config.limits.bogus: Extra inputs are not permitted"),
    ],
)
def test_damaged_manifest_names_the_field(manifest, tmp_path, damage, why):
    data = manifest.to_json()
    damage(data)
    f = written(tmp_path, data) / "manifest.json"
    assert refusal(tmp_path) == f"{f}: damaged build manifest ({why}); rebuild with `trt-spec build {GPU_CONFIG}`"


def test_missing_manifest(tmp_path):
    assert refusal(tmp_path) == (
        f"{tmp_path}: no manifest.json; run `trt-spec build CONFIG` first (it writes the manifest)"
    )


def test_cli_repo_refuses_an_old_manifest_on_one_line(manifest, tmp_path):
    old = {k: v for k, v in manifest.to_json().items() if k != MANIFEST_VERSION_KEY}
    f = written(tmp_path, old) / "manifest.json"
    r = CliRunner().invoke(main, ["repo", str(tmp_path)])
    assert r.exit_code == 2
    assert r.stderr.splitlines() == [
        f"error: {f}: build manifest from an older trt-spec (no trt_spec_manifest_version; this trt-spec reads "
        f"version {SCHEMA_VERSION}); rebuild with `trt-spec build {GPU_CONFIG}`"
    ]
    assert not (tmp_path / "model_repo").exists()


# ---------------------------------------------------------------------------------------------------------
# trt_spec_repo.json


def test_repo_record_round_trip(manifest, tmp_path):
    repo = tmp_path / "repo"
    write_repository(manifest, repo)
    data = json.loads((repo / "trt_spec_repo.json").read_text())
    assert list(data) == [REPO_VERSION_KEY, *REPO_KEYS]
    record = RepoRecord.read(repo)
    assert (
        record.deployment.placement.world_size == WorldSize(2, 1, 3)
        and record.orchestrator
        and record.gpu_ids == [0, 1]
    )
    assert record.to_json() == data
    sums = {"/e/target": EngineSums("engine-target", "c.yaml", {"rank0.engine": {"size": 3, "sha256": "ab"}})}
    with_sums = dataclasses.replace(record, engines=sums)
    with_sums.write(tmp_path / "other")
    assert RepoRecord.read(tmp_path / "other") == with_sums
    assert RepoRecord.read(tmp_path) is None  # no record: a repository trt-spec did not write


def test_serve_and_the_engine_model_refuse_an_old_repo_record(manifest, tmp_path):
    repo = tmp_path / "repo"
    write_repository(manifest, repo)
    f = repo / "trt_spec_repo.json"
    data = json.loads(f.read_text())
    del data[REPO_VERSION_KEY]
    f.write_text(json.dumps(data))
    line = (
        f"{f}: repository record from an older trt-spec (no trt_spec_repo_version; this trt-spec reads version "
        f"{REPO_SCHEMA_VERSION}); "
        f"regenerate it with `trt-spec repo BUILD_DIR --out {repo}`"
    )
    with pytest.raises(IntegrityError) as e:  # `trt-spec serve`, before starting anything
        verify_repository_engines(repo)
    assert str(e.value) == line
    with pytest.raises(IntegrityError) as e:  # the engine model's initialize()
        verify_served_engine(repo, "/any/engine")
    assert str(e.value) == line
    f.write_text('{"format": "something else"}')
    with pytest.raises(
        IntegrityError,
        match=r"trt_spec_repo\.json: not a trt-spec repository record \(no "
        r"trt_spec_repo_version field\); regenerate it with",
    ):
        verify_repository_engines(repo)


def test_manifest_records_the_calibration_set(manifest, tmp_path):
    """Which set quantize.py calibrated on: the Hub default (downloaded, no fingerprint) or a local directory with the
    sha256 of its files; a manifest from before the field reads as None (nothing recorded)."""
    from trt_spec.builder import calibration as cal

    assert manifest.calibration.dataset == "cnn_dailymail" and manifest.calibration.path is None
    assert manifest.calibration.fingerprint is None and manifest.calibration.calib_size == 512
    m = manifest_for_config(
        GPU_CONFIG, [f"quantization.calib_dataset={cal.BUNDLED_CALIB_DATASET}", "quantization.calib_size=64"]
    )
    c = m.calibration
    assert c.dataset == cal.BUNDLED_CALIB_DATASET and c.path == str(cal.resolve(cal.BUNDLED_CALIB_DATASET))
    assert c.fingerprint == cal.fingerprint(c.path) and c.fingerprint.startswith("sha256:") and c.samples == 64
    m.write(tmp_path)
    assert BuildManifest.read(tmp_path).calibration == c
    data = json.loads((tmp_path / "manifest.json").read_text())
    del data["calibration"]
    (tmp_path / "manifest.json").write_text(json.dumps(data))
    assert BuildManifest.read(tmp_path).calibration is None
    cpu = manifest_for_config(REPO / "build_configs" / "cpu-smollm2-ngram.yaml")
    assert cpu.calibration is None  # the reference engine scales FP8 per channel: no calibration set
