"""The memory plan of a repository about to be written: its weight-loading instances and the sets of models Triton
holds at once, over records/memory.py's maths.
"""

from __future__ import annotations

from typing import Optional

from tritonclient.grpc import model_config_pb2 as mc

from ..records import llmapi_contract as lc
from ..records.deployment import Deployment
from ..records.manifest import BuildManifest, RepoRecord
from ..records.memory import LLMAPI_SPEC_MODEL_WEIGHTS, Instance, concurrent_sets, instance_rows, repository_overflow
from ..records.names import BASELINE_ENGINE, DRAFT, TARGET

ENGINE_ROLES = {TARGET: "target", DRAFT: "draft", BASELINE_ENGINE: "baseline"}


def _param(cfg: mc.ModelConfig, key: str) -> str:
    return cfg.parameters[key].string_value if key in cfg.parameters else ""


def llmapi_instances(d: Deployment, yamls: dict[str, dict]) -> list[Instance]:
    """The instances of runtime llmapi's models (name -> 1/model.yaml): target and draft/head in one process each."""
    pre = d.models
    out: list[Instance] = []
    for name, y in yamls.items():
        tp, pp = int(y.get("tensor_parallel_size", 1)), int(y.get("pipeline_parallel_size", 1))
        kvc = y.get("kv_cache_config") or {}
        kv = "fp8" if kvc.get("dtype") == "fp8" else "none"
        frac = kvc.get("free_gpu_memory_fraction")
        tokens = kvc.get("max_tokens")
        devices = list(range(tp * pp))  # the LLM API takes the first tp*pp visible GPUs
        common = dict(kv_cache=kv, tp=tp, pp=pp, devices=devices, kv_fraction=frac, kv_tokens=tokens)
        out.append(Instance(name, "target", pre.target, d.weights, **common))
        spec = y.get("speculative_config") or {}
        extra = pre.head if spec.get("decoding_type") == lc.DECODING_TYPES["eagle3"] else pre.draft
        if spec.get(lc.SPEC_MODEL_DIR) and extra is not None:
            out.append(Instance(name, "draft", extra, LLMAPI_SPEC_MODEL_WEIGHTS, **common))
    return out


def instances(m: BuildManifest, configs: dict[str, mc.ModelConfig], yamls: dict[str, dict]) -> list[Instance]:
    """Every weight-loading instance of the repository (empty for the CPU reference engine)."""
    d = m.deployment
    if not d.gpu or m.gpu is None:
        return []
    pre = d.models
    out = llmapi_instances(d, yamls)
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
    inst = instances(m, configs, yamls)
    if not inst:
        return None
    sets = concurrent_sets(sorted(configs), record.load_models, record.phase_models)
    d = m.deployment
    return repository_overflow(
        inst, sets, d.limits, d.placement.memory_reserve_gib, m.gpu.name, m.gpu.memory_gib, m.gpu.count
    )


def plan_rows(m: BuildManifest, configs: dict[str, mc.ModelConfig], yamls: dict[str, dict], record: RepoRecord):
    """{set name: rows} per set of models held at once."""
    inst = instances(m, configs, yamls)
    return {
        what: [
            r
            for i in inst
            if i.model in names
            for r in instance_rows(i, m.deployment.limits, m.deployment.placement.memory_reserve_gib)
        ]
        for what, names in concurrent_sets(sorted(configs), record.load_models, record.phase_models).items()
    }
