"""The memory plan of the repository `trt-spec repo` is about to write: every model instance that loads weights, read
from the models as written (engine models' gpu_device_ids, kv_cache_free_gpu_mem_fraction and
max_tokens_in_paged_kv_cache; LLM-API models' model.yaml: tensor/pipeline parallel size, kv_cache_config, the
speculative model it loads beside the target), and the sets of models Triton holds at once (the record's
load_models and phase_models). The arithmetic is builder/memory.py's (memory_rows, kv_cache_gib); the model facts are
the preflight's. A repository that overflows a GPU is refused with one line before anything is written.
"""

from __future__ import annotations

from typing import Optional

from tritonclient.grpc import model_config_pb2 as mc

from ..builder.hardware import GpuSpec
from ..builder.memory import LLMAPI_SPEC_MODEL_WEIGHTS, Instance, concurrent_sets, instance_rows, repository_overflow
from ..builder.model_info import PreflightError
from ..records import llmapi_contract as lc
from ..records.manifest import BuildManifest, RepoRecord
from ..records.names import BASELINE_ENGINE, DRAFT, TARGET

ENGINE_ROLES = {TARGET: "target", DRAFT: "draft", BASELINE_ENGINE: "baseline"}


def _param(cfg: mc.ModelConfig, key: str) -> str:
    return cfg.parameters[key].string_value if key in cfg.parameters else ""


def instances(m: BuildManifest, configs: dict[str, mc.ModelConfig], yamls: dict[str, dict]) -> list[Instance]:
    """Every weight-loading instance of the repository (empty for the CPU reference engine)."""
    from ..builder.preflight import run_preflight

    if not m.config.recipe.gpu or m.gpu is None:
        return []
    g = m.gpu
    pre = run_preflight(
        m.config,
        GpuSpec(g.name, tuple(g.compute_capability), g.memory_gib, g.count, g.source),
        require_checkpoints=False,
    )
    out: list[Instance] = []
    for name, y in yamls.items():  # runtime llmapi: one LLM per model.yaml (target + its draft or head, one process)
        tp, pp = int(y.get("tensor_parallel_size", 1)), int(y.get("pipeline_parallel_size", 1))
        kvc = y.get("kv_cache_config") or {}
        kv = "fp8" if kvc.get("dtype") == "fp8" else "none"
        frac = kvc.get("free_gpu_memory_fraction")
        tokens = kvc.get("max_tokens")
        devices = list(range(tp * pp))  # the LLM API takes the first tp*pp visible GPUs
        common = dict(kv_cache=kv, tp=tp, pp=pp, devices=devices, kv_fraction=frac, kv_tokens=tokens)
        out.append(Instance(name, "target", pre.target, pre.quant.weights, **common))
        spec = y.get("speculative_config") or {}
        extra = pre.head if spec.get("decoding_type") == lc.DECODING_TYPES["eagle3"] else pre.draft
        if spec.get(lc.SPEC_MODEL_DIR) and extra is not None:
            out.append(Instance(name, "draft", extra, LLMAPI_SPEC_MODEL_WEIGHTS, **common))
    for name, cfg in configs.items():
        role = ENGINE_ROLES.get(name)
        if role is None or name in yamls or cfg.backend != "tensorrtllm":
            continue
        e = m.engines["target" if role == "baseline" and "baseline" not in m.engines else role]
        info = pre.draft if role == "draft" else pre.target
        devices = [int(d) for d in _param(cfg, "gpu_device_ids").split(",") if d.strip()] or list(e.devices)
        frac, tokens = _param(cfg, "kv_cache_free_gpu_mem_fraction"), _param(cfg, "max_tokens_in_paged_kv_cache")
        out.append(
            Instance(
                name,
                role,
                info,
                e.weights,
                e.kv_cache,
                e.tp,
                e.pp,
                devices,
                kv_fraction=float(frac) if frac else 0.9,
                kv_tokens=int(tokens) if tokens else None,
            )
        )
    return out


def overflow(
    m: BuildManifest, configs: dict[str, mc.ModelConfig], yamls: dict[str, dict], record: RepoRecord
) -> Optional[str]:
    """One line naming what overflows which GPU when the repository is served as its record says, else None."""
    try:
        inst = instances(m, configs, yamls)
    except PreflightError as e:
        return str(e)
    if not inst:
        return None
    sets = concurrent_sets(sorted(configs), record.load_models, record.phase_models)
    return repository_overflow(inst, sets, m.config, m.gpu.name, m.gpu.memory_gib, m.gpu.count)


def plan_rows(m: BuildManifest, configs: dict[str, mc.ModelConfig], yamls: dict[str, dict], record: RepoRecord):
    """(set name, rows) per set of models held at once: what `trt-spec repo` counts (for tests and display)."""
    inst = instances(m, configs, yamls)
    return {
        what: [r for i in inst if i.model in names for r in instance_rows(i, m.config)]
        for what, names in concurrent_sets(sorted(configs), record.load_models, record.phase_models).items()
    }
