"""The Triton repository of a `runtime: llmapi` deployment: TensorRT-LLM's LLM-API model twice over one checkpoint,
`tensorrt_llm` (speculative) and `tensorrt_llm_baseline`, each config.pbtxt + 1/model.yaml + NVIDIA's 1/model.py.

The two never load together, as each is a full target copy with its own KV cache
(upstream-facts: llmapi-kv-cache-free-memory): the baseline is a phase model that check and bench swap in. NVIDIA's
model.py comes from the image; where it is absent the repository is written without it and serve refuses to start.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Optional

import yaml
from tritonclient.grpc import model_config_pb2 as mc

from ..errors import TrtSpecError
from ..records import llmapi_contract as lc
from ..records.manifest import BuildManifest, RepoRecord
from ..records.speculation import Mode
from .common import RepoPlan, model_repo_sources, write_config

DTYPES = {"TYPE_STRING", "TYPE_BOOL", "TYPE_INT32", "TYPE_INT64", "TYPE_UINT64", "TYPE_FP32"}
CANCELLATION_CHECK_PERIOD_MS = 100  # upstream-facts: llmapi-cancellation-poll
# tried in order when the config names none; unverified on the image (docs/serving.md's checklist finds it)
LLMAPI_SOURCE_CANDIDATES = (
    "/app/all_models/llmapi/tensorrt_llm/1",
    "/app/tensorrt_llm/triton_backend/all_models/llmapi/tensorrt_llm/1",
    "/opt/tritonserver/tensorrtllm_backend/all_models/llmapi/tensorrt_llm/1",
)


# phase-only model -> the launch models it replaces while loaded
LAUNCH_MODELS = [lc.MODEL_NAME]
PHASE_MODELS = {lc.BASELINE_MODEL: [lc.MODEL_NAME]}


class LlmapiRepositoryError(TrtSpecError, ValueError):
    """What is wrong with the LLM-API repository and the fix, in one line."""


def speculative_config(m: BuildManifest) -> Optional[dict]:
    """The LLM's speculative_config for the manifest's mode; None for mode none."""
    s = m.deployment.speculation
    mode, k = s.mode, s.max_draft_len
    if mode is Mode.NONE:
        return None
    out: dict = {"decoding_type": lc.DECODING_TYPES[mode], "max_draft_len": k}
    match mode:
        case Mode.DRAFT_TARGET:
            out[lc.SPEC_MODEL_DIR] = m.engines["draft"].dir
        case Mode.NGRAM:
            out[lc.NGRAM_MATCH] = s.ngram_size
        case Mode.EAGLE3:
            out[lc.SPEC_MODEL_DIR] = m.engines["draft"].dir
            out[lc.EAGLE3_ONE_MODEL] = s.eagle3_one_model
        case Mode.MTP:
            del out["max_draft_len"]  # upstream-facts: llmapi-mtp-max-draft-len
            out[lc.NUM_NEXTN] = s.num_nextn_predict_layers
    return out


def model_yaml(m: BuildManifest, *, speculative: bool, decoupled: bool) -> dict:
    """model.yaml: the LLM's arguments and triton_config."""
    lim, t = m.deployment.limits, m.target
    kv: dict = {"free_gpu_memory_fraction": m.deployment.placement.kv_cache_free_gpu_mem_fraction}
    kv["enable_block_reuse"] = True
    if t.kv_cache == "fp8":
        kv["dtype"] = "fp8"
    y: dict = {
        "model": t.dir,
        "backend": "pytorch",
        "tensor_parallel_size": t.tp,
        "pipeline_parallel_size": t.pp,
        "max_batch_size": lim.max_batch_size,
        "max_seq_len": lim.max_seq_len,
        "max_num_tokens": lim.max_num_tokens,
        "kv_cache_config": kv,
        "cuda_graph_config": {"max_batch_size": lim.max_batch_size, "enable_padding": True},
        "return_perf_metrics": True,
    }
    spec = speculative_config(m) if speculative else None
    if spec is not None:
        y["speculative_config"] = spec
    # upstream-facts: llmapi-max-batch-size-zero
    y[lc.TRITON_KEY] = {
        "max_batch_size": 0,
        "decoupled": decoupled,
        "cancellation_check_period_ms": CANCELLATION_CHECK_PERIOD_MS,
    }
    return y


def _tensor(cls, t: lc.Tensor):
    x = cls(name=t.name, data_type=mc.DataType.Value(t.dtype), dims=list(t.dims))
    if cls is mc.ModelInput and t.optional:
        x.optional = True
    return x


def model_config(name: str, decoupled: bool) -> mc.ModelConfig:
    """config.pbtxt of one LLM-API model."""
    cfg = mc.ModelConfig(name=name, backend=lc.BACKEND, max_batch_size=0)
    cfg.model_transaction_policy.decoupled = decoupled
    cfg.input.extend(_tensor(mc.ModelInput, t) for t in lc.INPUTS)
    cfg.output.extend(_tensor(mc.ModelOutput, t) for t in lc.OUTPUTS)
    cfg.instance_group.add(count=1, kind=mc.ModelInstanceGroup.KIND_CPU)
    return cfg


def model_repo_llmapi() -> Path:
    """The CPU stand-in of the LLM-API model."""
    return model_repo_sources() / "llmapi" / "1"


def llmapi_source(configured: str) -> Optional[Path]:
    """NVIDIA's LLM-API model directory (its model.py) on this machine, or None."""
    for d in [configured] if configured else LLMAPI_SOURCE_CANDIDATES:
        if (Path(d) / "model.py").is_file():
            return Path(d)
    return None


def llmapi_models(m: BuildManifest, decoupled: bool) -> dict[str, tuple[mc.ModelConfig, dict]]:
    """name -> (config.pbtxt, model.yaml) of the repository."""
    return {
        lc.MODEL_NAME: (model_config(lc.MODEL_NAME, decoupled), model_yaml(m, speculative=True, decoupled=decoupled)),
        lc.BASELINE_MODEL: (
            model_config(lc.BASELINE_MODEL, decoupled),
            model_yaml(m, speculative=False, decoupled=decoupled),
        ),
    }


def record(m: BuildManifest, decoupled: bool, names) -> RepoRecord:
    """The LLM-API repository's record: one tritonserver process (the LLM API spawns its own ranks)."""
    return RepoRecord(
        name=m.name,
        config_hash=m.config_hash,
        deployment=m.deployment,
        orchestrator=False,
        mpi_ranks=1,
        models=sorted(names),
        decoupled=decoupled,
        gpu_ids=sorted(set(m.deployment.placement.target_devices)),
        engines={},
        load_models=list(LAUNCH_MODELS),
        phase_models={k: list(v) for k, v in PHASE_MODELS.items()},
    )


def write_models(m: BuildManifest, root: Path, decoupled: bool) -> tuple[dict[str, mc.ModelConfig], Optional[Path]]:
    """Write both models under `root`; (configs, where model.py was copied from or None)."""
    source = llmapi_source(m.config.toolchain.llmapi_model_dir) if m.deployment.gpu else model_repo_llmapi()
    configs = {}
    for name, (cfg, y) in llmapi_models(m, decoupled).items():
        d = root / name
        write_config(d, cfg)
        (d / "1" / lc.YAML_FILE).write_text(yaml.safe_dump(y, sort_keys=False))
        if source is not None:
            for f in source.glob("*.py"):
                shutil.copy2(f, d / "1" / f.name)
        configs[name] = cfg
    return configs, source


def repo_plan(m: BuildManifest, decoupled: bool) -> RepoPlan:
    """The runtime llmapi repository's plan."""
    models = llmapi_models(m, decoupled)

    def write(root: Path) -> None:
        write_models(m, root, decoupled)

    return RepoPlan(
        configs={n: c for n, (c, _) in models.items()},
        record=record(m, decoupled, models),
        write=write,
        yamls={n: y for n, (_, y) in models.items()},
        require_sources=False,
    )


def check_model(cfg: mc.ModelConfig, y: dict, where: str) -> None:
    """An LLM-API model's config and model.yaml against the recorded contract; LlmapiRepositoryError."""
    want_in = {t.name: t for t in lc.INPUTS}
    have_in = {i.name: i for i in cfg.input}
    for name, t in want_in.items():
        i = have_in.get(name)
        if i is None or mc.DataType.Name(i.data_type) != t.dtype or list(i.dims) != list(t.dims):
            raise LlmapiRepositoryError(
                f"{where}: input {name} is not the LLM-API model's ({t.dtype} {list(t.dims)}); "
                "regenerate with trt-spec repo"
            )
    extra = sorted(set(have_in) - set(want_in))
    if extra:
        raise LlmapiRepositoryError(f"{where}: input {extra[0]} is not one the LLM-API model reads")
    if {o.name for o in cfg.output} != {t.name for t in lc.OUTPUTS}:
        raise LlmapiRepositoryError(f"{where}: outputs differ from the LLM-API model's; regenerate with trt-spec repo")
    if cfg.max_batch_size != 0:
        raise LlmapiRepositoryError(f"{where}: max_batch_size {cfg.max_batch_size}; the LLM-API model takes 0")
    unknown = sorted(set(y) - set(lc.LLM_KEYS) - {lc.TRITON_KEY})
    if unknown:
        raise LlmapiRepositoryError(f"{where}: model.yaml key {unknown[0]!r} is not an LLM argument trt-spec writes")
    tc = y.get(lc.TRITON_KEY) or {}
    if set(tc) - set(lc.TRITON_KEYS) or bool(tc.get("decoupled")) != cfg.model_transaction_policy.decoupled:
        raise LlmapiRepositoryError(
            f"{where}: triton_config disagrees with config.pbtxt; regenerate with trt-spec repo"
        )
    spec = y.get("speculative_config")
    if spec is not None and spec.get("decoding_type") not in lc.DECODING_TYPES.values():
        raise LlmapiRepositoryError(
            f"{where}: speculative_config decoding_type {spec.get('decoding_type')!r} is not one "
            f"of {', '.join(lc.DECODING_TYPES.values())} (TensorRT-LLM 1.2)"
        )
    for key in ("kv_cache_config", "cuda_graph_config"):
        allowed = lc.KV_CACHE_KEYS if key == "kv_cache_config" else lc.CUDA_GRAPH_KEYS
        bad = sorted(set(y.get(key) or {}) - set(allowed))
        if bad:
            raise LlmapiRepositoryError(f"{where}: {key}.{bad[0]} is not a field trt-spec writes")


SOURCE_MISSING = (
    "{name}: no 1/model.py: copy NVIDIA's LLM-API model (TensorRT-LLM triton_backend/all_models/llmapi/"
    "tensorrt_llm/1/*.py, in the NGC image) into {dir}, or rerun trt-spec repo on the GPU host with "
    "toolchain.llmapi_model_dir set to it"
)


def missing_sources(repo: Path) -> list[str]:
    """One line per LLM-API model of the repository that lacks NVIDIA's model.py."""
    return [
        SOURCE_MISSING.format(name=f.parent.parent.name, dir=f.parent)
        for f in sorted(Path(repo).glob(f"*/1/{lc.YAML_FILE}"))
        if not (f.parent / "model.py").is_file()
    ]


def validate(repo: Path, models: dict[str, mc.ModelConfig], *, require_source: bool) -> None:
    """Every LLM-API model of a repository against the contract; require_source: model.py must be there too."""
    for name, cfg in models.items():
        f = Path(repo) / name / "1" / lc.YAML_FILE
        if not f.is_file():
            continue
        check_model(cfg, yaml.safe_load(f.read_text()) or {}, name)
        if require_source and not (f.parent / "model.py").is_file():
            raise LlmapiRepositoryError(SOURCE_MISSING.format(name=name, dir=f.parent))
