"""Config -> preflight -> plan -> the manifest the runner would write, for callers that skip the build run."""

from __future__ import annotations

from pathlib import Path
from typing import Iterable, Optional

from ..records.config import BuildConfig, load_config
from ..records.manifest import BuildManifest
from .hardware import detect_gpus, resolve_gpu
from .plan import Plan, make_plan
from .preflight import run_preflight
from .runner import build_manifest


def plan_for(
    cfg: BuildConfig,
    config_path: Path,
    gpu: Optional[str] = None,
    *,
    require_checkpoints: bool = True,
    allow_offload: Optional[bool] = None,
) -> Plan:
    """config -> preflight -> plan, for `gpu` (NAME[:COUNT]) or the config's.

    A build checks calibration against this host's GPUs (quantize.py uses them all); allow_offload as run_preflight.
    Raises PreflightError or HardwareError."""
    gpu_spec = resolve_gpu(cfg.gpu, gpu) if cfg.recipe.gpu else None
    host = detect_gpus() if require_checkpoints and cfg.recipe.gpu else None
    report = run_preflight(
        cfg, gpu_spec, require_checkpoints=require_checkpoints, allow_offload=allow_offload, calibration_gpu=host
    )
    return make_plan(cfg, report, Path(config_path))


def manifest_for_config(config_path: Path, sets: Iterable[str] = (), gpu: Optional[str] = None) -> BuildManifest:
    """The manifest of a config's plan before its build (files None). Raises ConfigError, PreflightError or
    HardwareError."""
    plan = plan_for(load_config(config_path, tuple(sets)), Path(config_path), gpu, require_checkpoints=False)
    return build_manifest(plan, Path(config_path), [])


def manifest_from(source: Path, sets: Iterable[str] = (), gpu: Optional[str] = None) -> BuildManifest:
    """BUILD_DIR (its manifest.json, as the build wrote it) or CONFIG (its plan, before the build)."""
    source = Path(source)
    if source.is_dir():
        return BuildManifest.read(source)
    return manifest_for_config(source, sets, gpu)
