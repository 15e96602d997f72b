"""Repository writer: goldens for a TensorRT config, parse-back, leftover/cross-reference checks."""

import os
import shutil
from pathlib import Path

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from trt_spec.builder.pipeline import manifest_for_config
from trt_spec.records import backend_contract as bc
from trt_spec.records.deployment import WorldSize
from trt_spec.records.manifest import RepoRecord
from trt_spec.repository.writer import RepositoryError, parse_config, validate_repository, write_repository

from ..conftest import REPO

GOLDEN = REPO / "tests" / "golden" / "repo"
UPDATE = os.environ.get("TRT_SPEC_UPDATE_GOLDENS") == "1"
SEED = REPO / "build_configs" / "llama33-70b-fp8-h100-tp2.yaml"


@pytest.fixture(scope="module")
def gpu_repo(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("r") / "repo"
    write_repository(manifest_for_config(SEED), out)
    return out


def normalized(text: str) -> str:
    return text.replace(str(REPO), "<REPO>")


@pytest.mark.parametrize(
    "model", ["tensorrt_llm", "tensorrt_llm_draft", "tensorrt_llm_bls", "ensemble", "preprocessing", "postprocessing"]
)
def test_tensorrt_repository_goldens(gpu_repo, model):
    got = normalized((gpu_repo / model / "config.pbtxt").read_text())
    golden = GOLDEN / f"llama33-70b-fp8-h100-tp2.{model}.pbtxt"
    if UPDATE:
        golden.write_text(got)
    assert got == golden.read_text()


IN_ENGINE = ("vicuna-7b-eagle-h100", "llama31-8b-lookahead-fp8-h100")  # the engine path's EAGLE and lookahead configs


@pytest.fixture(scope="module")
def in_engine_repos(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("in_engine")
    out = {}
    for name in IN_ENGINE:
        out[name] = root / name
        write_repository(manifest_for_config(REPO / "build_configs" / f"{name}.yaml"), out[name])
    return out


@pytest.mark.parametrize(
    "model",
    ["tensorrt_llm", "tensorrt_llm_baseline", "tensorrt_llm_bls", "ensemble", "preprocessing", "postprocessing"],
)
@pytest.mark.parametrize("name", IN_ENGINE)
def test_in_engine_repository_goldens(in_engine_repos, name, model):
    """EAGLE and lookahead on the engine path: the speculative engine (decoding_mode and its tree or (W, N, G)), the
    plain baseline engine the ensemble runs, and the BLS in engine mode."""
    got = normalized((in_engine_repos[name] / model / "config.pbtxt").read_text())
    golden = GOLDEN / f"{name}.{model}.pbtxt"
    if UPDATE:
        golden.write_text(got)
    assert golden.is_file(), (
        f"missing golden {golden}; run TRT_SPEC_UPDATE_GOLDENS=1 pytest tests/repository/test_repository.py"
    )
    assert got == golden.read_text()


def test_in_engine_repositories_speculate_in_the_engine(in_engine_repos):
    eagle = {
        k: v.string_value
        for k, v in parse_config(
            in_engine_repos["vicuna-7b-eagle-h100"] / "tensorrt_llm" / "config.pbtxt"
        ).parameters.items()
    }
    assert eagle["decoding_mode"] == "eagle" and "eagle_choices" not in eagle  # the backend's default EAGLE-1 tree
    la = {
        k: v.string_value
        for k, v in parse_config(
            in_engine_repos["llama31-8b-lookahead-fp8-h100"] / "tensorrt_llm" / "config.pbtxt"
        ).parameters.items()
    }
    assert la["decoding_mode"] == "lookahead"
    assert (la["lookahead_window_size"], la["lookahead_ngram_size"], la["lookahead_verification_set_size"]) == (
        "4",
        "4",
        "4",
    )  # (N-2) + (W-1+G)(N-1) = 23 = the engine's max_draft_len
    for repo in in_engine_repos.values():
        base = {
            k: v.string_value
            for k, v in parse_config(repo / "tensorrt_llm_baseline" / "config.pbtxt").parameters.items()
        }
        assert "decoding_mode" not in base and base["gpt_model_path"].endswith("engines/baseline")
        bls = parse_config(repo / "tensorrt_llm_bls" / "config.pbtxt").parameters
        assert bls["speculative_mode"].string_value == "engine" and not (repo / "tensorrt_llm_draft").exists()
        ens = parse_config(repo / "ensemble" / "config.pbtxt")
        assert [st.model_name for st in ens.ensemble_scheduling.step][1] == "tensorrt_llm_baseline"


def test_tensorrt_engine_parameters(gpu_repo):
    cfg = parse_config(gpu_repo / "tensorrt_llm" / "config.pbtxt")
    p = {k: v.string_value for k, v in cfg.parameters.items()}
    assert cfg.backend == "tensorrtllm" and cfg.model_transaction_policy.decoupled
    assert p["gpt_model_type"] == "inflight_fused_batching"
    # absolute, as NVIDIA's templates are filled: the backend opens gpt_model_path against tritonserver's working
    # directory, so only an absolute path works for every launch (serve restricts the config API instead)
    assert p["gpt_model_path"] == str(REPO / "build" / "llama33-70b-fp8-h100-tp2" / "engines" / "target")
    assert p["tokenizer_dir"] == "/models/Llama-3.3-70B-Instruct-FP8"
    pre = parse_config(gpu_repo / "preprocessing" / "config.pbtxt").parameters
    assert pre["tokenizer_dir"].string_value == "/models/Llama-3.3-70B-Instruct-FP8"
    assert not [f for f in gpu_repo.rglob("*") if f.is_symlink()]  # no links into this machine
    assert p["enable_kv_cache_reuse"] == "true" and p["exclude_input_in_output"] == "false"
    assert p["max_beam_width"] == "1" and p["gpu_device_ids"] == "0,1"
    assert p["kv_cache_free_gpu_mem_fraction"] == "0.85"  # leaves the draft (sharing GPU 0) its room
    d = {
        k: v.string_value for k, v in parse_config(gpu_repo / "tensorrt_llm_draft" / "config.pbtxt").parameters.items()
    }
    assert d["gpu_device_ids"] == "0" and d["gpt_model_path"].endswith("build/llama33-70b-fp8-h100-tp2/engines/draft")
    assert d["max_tokens_in_paged_kv_cache"] == str(8 * 8192) and "max_tokens_in_paged_kv_cache" not in p
    allowed = (
        set(bc.REQUIRED_PARAMETERS)
        | set(bc.PARAMETER_DEFAULTS)
        | set(bc.LOOKAHEAD_PARAMETERS)
        | {"medusa_choices", "eagle_choices", "participant_ids"}
    )
    assert set(p) <= allowed  # only the backend's own parameter keys
    names = {i.name: i for i in cfg.input}
    assert names["input_ids"].data_type == mc.TYPE_INT32 and list(names["input_ids"].dims) == [-1]
    assert names["draft_input_ids"].optional and names["seed"].data_type == mc.TYPE_UINT64
    assert {o.name for o in cfg.output} >= {
        "output_ids",
        "sequence_length",
        "acceptance_rate",
        "total_accepted_draft_tokens",
        "total_draft_tokens",
    }
    record = RepoRecord.read(gpu_repo)
    assert (
        record.orchestrator is True
        and record.deployment.placement.world_size == WorldSize(2, 1, 3)
        and record.mpi_ranks == 1
    )
    assert record.engines == {}  # written from the config's plan: no engine built, no sums yet


def test_medusa_repository_sets_decoding_mode(tmp_path):
    write_repository(manifest_for_config(REPO / "build_configs" / "vicuna-7b-medusa-fp8-h100.yaml"), tmp_path / "r")
    p = parse_config(tmp_path / "r" / "tensorrt_llm" / "config.pbtxt").parameters
    assert p["decoding_mode"].string_value == "medusa"
    assert not (tmp_path / "r" / "tensorrt_llm_draft").exists()
    bls = parse_config(tmp_path / "r" / "tensorrt_llm_bls" / "config.pbtxt").parameters
    assert bls["speculative_mode"].string_value == "engine"


def test_every_file_parses_and_has_no_template_leftovers(gpu_repo):
    for f in gpu_repo.glob("*/config.pbtxt"):
        text = f.read_text()
        assert "${" not in text
        text_format.Parse(text, mc.ModelConfig())
    assert (gpu_repo / "tensorrt_llm_bls" / "1" / "model.py").is_file()
    assert not (gpu_repo / "tensorrt_llm" / "1" / "model.py").exists()  # C++ backend: no python source


def broken_copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst, symlinks=True)
    return dst


def test_validator_rejects_template_leftover(gpu_repo, tmp_path):
    r = broken_copy(gpu_repo, tmp_path / "r")
    f = r / "tensorrt_llm" / "config.pbtxt"
    f.write_text(
        f.read_text().replace('string_value: "inflight_fused_batching"', 'string_value: "${batching_strategy}"')
    )
    with pytest.raises(RepositoryError, match=r"unfilled template variable \$\{batching_strategy\}"):
        validate_repository(r)


def test_validator_rejects_dangling_ensemble_tensor(gpu_repo, tmp_path):
    r = broken_copy(gpu_repo, tmp_path / "r")
    f = r / "ensemble" / "config.pbtxt"
    f.write_text(f.read_text().replace('value: "_INPUT_ID"', 'value: "_INPUT_IDS"', 1))
    with pytest.raises(RepositoryError, match="ensemble: step .* reads '_INPUT_ID'|which no earlier step"):
        validate_repository(r)


def test_validator_rejects_missing_draft_model(gpu_repo, tmp_path):
    r = broken_copy(gpu_repo, tmp_path / "r")
    shutil.rmtree(r / "tensorrt_llm_draft")
    with pytest.raises(RepositoryError, match="tensorrt_llm_draft_model_name names model 'tensorrt_llm_draft'"):
        validate_repository(r)


def test_validator_rejects_unknown_field(gpu_repo, tmp_path):
    r = broken_copy(gpu_repo, tmp_path / "r")
    f = r / "preprocessing" / "config.pbtxt"
    f.write_text(f.read_text() + "\nbogus_field: 3\n")
    with pytest.raises(RepositoryError, match="not a valid Triton ModelConfig"):
        validate_repository(r)


def test_rewrite_is_atomic_and_safe(gpu_repo, tmp_path):
    dest = tmp_path / "r"
    m = manifest_for_config(SEED)
    write_repository(m, dest)
    (dest / "stale.txt").write_text("old")
    write_repository(m, dest)  # rerun over an existing repository replaces it whole
    assert not (dest / "stale.txt").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def _engine_cfg(repo: Path, model: str) -> mc.ModelConfig:
    return parse_config(repo / model / "config.pbtxt")


@pytest.mark.parametrize("model", ["tensorrt_llm", "tensorrt_llm_draft"])
def test_cpu_and_gpu_engine_models_differ_only_in_backend(tmp_path, model):
    """One code path writes both: the CPU stand-in carries the GPU parameters block and tensor interface."""
    gpu = tmp_path / "gpu"
    cpu = tmp_path / "cpu"
    write_repository(manifest_for_config(REPO / "build_configs" / "llama33-70b-fp8-h200.yaml"), gpu)
    write_repository(manifest_for_config(REPO / "build_configs" / "cpu-smollm2-draft.yaml"), cpu)
    g, c = _engine_cfg(gpu, model), _engine_cfg(cpu, model)
    assert (g.backend, c.backend) == ("tensorrtllm", "python")
    assert set(g.parameters) == set(c.parameters) and set(bc.REQUIRED_PARAMETERS) <= set(c.parameters)
    same = (
        "gpt_model_type",
        "max_beam_width",
        "enable_kv_cache_reuse",
        "enable_chunked_context",
        "exclude_input_in_output",
        "batch_scheduler_policy",
        "xgrammar_tokenizer_info_path",
        "guided_decoding_backend",
    )
    assert all(g.parameters[k].string_value == c.parameters[k].string_value for k in same)
    for field in (
        "input",
        "output",
        "model_transaction_policy",
        "dynamic_batching",
        "instance_group",
        "max_batch_size",
    ):
        assert getattr(g, field) == getattr(c, field), field


def test_every_shipped_gpu_config_carries_the_unguarded_parameters(tmp_path):
    for path in sorted((REPO / "build_configs").glob("*.yaml")):
        out = tmp_path / path.stem
        write_repository(manifest_for_config(path), out)
        for model in ("tensorrt_llm", "tensorrt_llm_draft"):
            if (out / model).is_dir() and not (out / model / "1" / "model.yaml").is_file():  # llmapi: its own contract
                params = {k: v.string_value for k, v in _engine_cfg(out, model).parameters.items()}
                bc.check_parameters(params)  # what the backend checks at load
                assert params["guided_decoding_backend"] == "" and params["xgrammar_tokenizer_info_path"] == ""


def test_validator_rejects_an_engine_model_the_backend_would_not_load(gpu_repo, tmp_path):
    bad = tmp_path / "bad"
    shutil.copytree(gpu_repo, bad, symlinks=True)
    cfg = bad / "tensorrt_llm" / "config.pbtxt"
    m = parse_config(cfg)
    del m.parameters["guided_decoding_backend"]
    cfg.write_text(text_format.MessageToString(m))
    with pytest.raises(RepositoryError, match="Cannot find parameter with name: guided_decoding_backend"):
        validate_repository(bad)


def test_no_decoupled_variant(tmp_path):
    write_repository(manifest_for_config(SEED), tmp_path / "r", decoupled=False)
    for model in ("tensorrt_llm", "tensorrt_llm_draft", "tensorrt_llm_bls"):
        assert not _engine_cfg(tmp_path / "r", model).model_transaction_policy.decoupled


def test_preprocessing_and_bls_admit_the_configured_prompt_limit(tmp_path):
    write_repository(manifest_for_config(REPO / "build_configs" / "qwen25-coder-32b-ngram-h100.yaml"), tmp_path / "r")
    pre = _engine_cfg(tmp_path / "r", "preprocessing").parameters
    bls = _engine_cfg(tmp_path / "r", "tensorrt_llm_bls").parameters
    # limits.max_input_len 8192, under the engine's min(max_seq_len - 1, max_num_tokens) = 16383
    assert pre["max_input_len"].string_value == bls["max_input_len"].string_value == "8192"
    assert bls["max_num_tokens"].string_value == "16384"


def test_make_engines_uses_the_images_python_and_downloads_no_torch():
    import subprocess

    out = subprocess.run(
        ["make", "-n", "engines", "gpu-setup", "CONFIG=build_configs/llama33-70b-fp8-h200.yaml"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert ".venv" not in out and "torch" not in out and "-m trt_spec.cli build" in out


def test_no_ensemble_output_alone_loses_a_step(gpu_repo):
    """Triton core prunes an ensemble step once every ensemble output it maps is unrequested (pruned_steps). The
    engine step maps only internal tensors (_TOKENS_BATCH, _SEQUENCE_LENGTH) and perf outputs, so a client asking for
    text_output alone (NVIDIA's clients) keeps every step."""
    from trt_spec.repository.writer import pruned_steps

    ens = parse_config(gpu_repo / "ensemble" / "config.pbtxt")
    assert pruned_steps(ens, {"text_output"}) == set()
    assert pruned_steps(ens, {o.name for o in ens.output}) == set()
    llm = next(s for s in ens.ensemble_scheduling.step if s.model_name == "tensorrt_llm")
    assert llm.output_map["output_ids"] == "_TOKENS_BATCH" and llm.output_map["sequence_length"] == "_SEQUENCE_LENGTH"


def test_an_ensemble_mapping_engine_outputs_straight_out_is_refused(gpu_repo, tmp_path):
    """The layout that failed on first contact (the engine's output_ids/sequence_length as ensemble outputs, read by
    postprocessing): asked for text_output alone, Triton prunes the engine step, and the validator says so."""
    from trt_spec.repository.writer import pruned_steps

    repo = tmp_path / "repo"
    shutil.copytree(gpu_repo, repo, symlinks=True)
    path = repo / "ensemble" / "config.pbtxt"
    ens = parse_config(path)
    for o in ("output_ids", "sequence_length"):
        ens.output.add(name=o, data_type=mc.TYPE_INT32, dims=[-1])
    del ens.output[1]  # trt-spec's postprocessing output_ids: the old layout had the engine's under that name
    steps = ens.ensemble_scheduling.step
    llm = next(s for s in steps if s.model_name == "tensorrt_llm")
    post = next(s for s in steps if s.model_name == "postprocessing")
    llm.output_map["output_ids"], llm.output_map["sequence_length"] = "output_ids", "sequence_length"
    post.input_map["TOKENS_BATCH"], post.input_map["SEQUENCE_LENGTH"] = "output_ids", "sequence_length"
    del post.output_map["OUTPUT_IDS"]
    path.write_text(text_format.MessageToString(ens))
    assert 1 in pruned_steps(ens, {"text_output"})  # the engine step
    with pytest.raises(RepositoryError, match="a request for 'text_output' alone loses step tensorrt_llm"):
        validate_repository(repo)
