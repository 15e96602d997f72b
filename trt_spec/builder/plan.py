"""Plan: a build config + preflight report -> an ordered list of Steps (argv, env, inputs, output, fingerprint).

Pure: it runs nothing; `trt-spec plan` prints it and `trt-spec build` hands it to the runner.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Optional

from ..errors import TrtSpecError
from ..records.backend_contract import LOGITS_DTYPE
from ..records.config import BuildConfig, EagleTrain
from ..records.defaults import CALIB_BATCH_SIZE, TOKENS_PER_BLOCK
from ..records.procutil import shell_line
from ..records.speculation import Mode
from . import trtllm
from .hardware import GpuSpec
from .model_info import is_imported
from .preflight import PreflightReport
from .quantize_peak import PEAK_MODULE, PEAK_SUFFIX
from .trtllm import DTYPE_FOR_FORMAT, QUANTIZE_CALIBRATED, SPEC_MODE_TO_TRTLLM, TRTLLM_ARCHITECTURES

STEP_STAMP = ".trt-spec-step.json"  # written into every finished step output


class PlanError(TrtSpecError, RuntimeError):
    """The planner produced something the target tool would reject (a trt-spec bug, not a user error)."""


@dataclass(frozen=True)
class Step:
    name: str
    description: str
    argv: tuple[str, ...]
    output: str
    inputs: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    fingerprint: str = ""

    def shell(self) -> str:
        return shell_line(self.argv, self.env)


@dataclass
class Plan:
    name: str
    config_hash: str
    engine: str
    output_dir: str
    gpu: Optional[GpuSpec]
    report: PreflightReport
    steps: list[Step]
    engines: dict[str, str]  # role -> engine directory
    # role -> the HF directory an import/distill step writes for it
    sources: dict[str, str] = field(default_factory=dict)

    def step(self, name: str) -> Step:
        for s in self.steps:
            if s.name == name:
                return s
        raise KeyError(name)

    def to_json(self) -> dict:
        r = self.report
        return {
            "name": self.name,
            "config_hash": self.config_hash,
            "engine": self.engine,
            "output_dir": self.output_dir,
            "gpu": None
            if self.gpu is None
            else {
                "name": self.gpu.name,
                "compute_capability": list(self.gpu.compute_capability),
                "memory_gib": self.gpu.memory_gib,
                "count": self.gpu.count,
                "source": self.gpu.source,
            },
            "quantization": {"weights": r.quant.weights, "kv_cache": r.quant.kv_cache, "fell_back": r.quant.fell_back},
            "speculative": {
                "mode": r.config.speculative.mode.value,
                "max_draft_len": r.max_draft_len,
                "num_draft_tokens": r.num_draft_tokens,
            },
            "devices": {"target": r.target_devices, "draft": r.draft_devices},
            "kv_cache_free_gpu_mem_fraction": r.kv_cache_free_gpu_mem_fraction,
            "draft_max_tokens_in_paged_kv_cache": r.draft_kv_tokens,
            "fp8_context_fmha": r.quant.fp8_context_fmha,
            "calibration": None if r.calibration is None else asdict(r.calibration),
            "prequantized": {role: asdict(p) for role, p in r.prequantized.items()},
            "calibration_peaks": r.calibration_peaks,
            "memory": [dict(asdict(m), total_gib=m.total_gib) for m in r.memory],
            "warnings": r.warnings,
            "notes": r.notes,
            "engines": self.engines,
            "steps": [asdict(s) for s in self.steps],
        }

    def to_text(self) -> str:
        r = self.report
        lines = [f"plan {self.name} (config {self.config_hash}, engine {self.engine}) -> {self.output_dir}"]
        if self.gpu:
            lines.append(f"gpu: {self.gpu.describe()}")
        kv = {"none": "16-bit (not quantized)"}.get(r.quant.kv_cache, r.quant.kv_cache)
        lines.append(
            f"quantization: weights {r.quant.weights}, KV cache {kv}"
            + (" (fallback: no FP8 on this GPU)" if r.quant.fell_back else "")
            + (
                ", FP8 context FMHA (TensorRT-LLM enables it with FP8 weights + FP8 KV)"
                if "engine" in r.config.recipe.steps and r.quant.fp8_context_fmha
                else ""
            )
        )
        lines.append(f"speculative: {r.config.speculative.mode}, max_draft_len {r.max_draft_len}")
        if r.config.recipe.llm_api:
            lines.append(
                "runtime: llmapi (TensorRT-LLM's LLM API, PyTorch): no engine to build"
                + (" (but the import/distill steps below)" if self.steps else "")
                + "; build checks the checkpoints and writes the manifest, repo writes model.yaml"
            )
        if r.memory:
            lines.append("memory plan per GPU:")
            lines += ["  " + ln for ln in r.memory_table().splitlines()]
        lines += [f"note: {n}" for n in r.notes]
        lines += [f"warning: {w}" for w in r.warnings]
        for i, s in enumerate(self.steps, 1):
            lines.append(f"[{i}/{len(self.steps)}] {s.name}: {s.description}")
            lines.append(f"    {s.shell()}")
        return "\n".join(lines)

    def to_sh(self) -> str:
        out = [
            "#!/usr/bin/env bash",
            f"# trt-spec plan {self.name} (config {self.config_hash}); generated, do not edit.",
            f"# GPU: {self.gpu.describe() if self.gpu else 'n/a'}",
            "# Runs every build step in order. `trt-spec build` runs the same commands incrementally and atomically.",
            "set -euo pipefail",
        ]
        for i, s in enumerate(self.steps, 1):
            out.append(f"\n# [{i}/{len(self.steps)}] {s.name}: {s.description}")
            out.append(s.shell())
        return "\n".join(out) + "\n"


# -- Fingerprints


def path_identity(path: str) -> str:
    """Cheap identity of an input directory/file: config.json digest + (name, size, mtime) of its files."""
    p = Path(path)
    if not p.exists():
        return f"missing:{path}"
    h = hashlib.sha256(str(p.resolve()).encode())
    files = [p] if p.is_file() else sorted(q for q in p.iterdir() if q.is_file())
    for q in files:
        st = q.stat()
        h.update(f"{q.name}:{st.st_size}:{st.st_mtime_ns}".encode())
        if q.name == "config.json":
            h.update(q.read_bytes())
    return h.hexdigest()[:16]


def _interpreter(arg: str) -> str:
    """This interpreter under any of its names is one fingerprint token, so neither rebuilds the other's steps."""
    try:
        same = os.path.basename(arg).startswith("python") and os.path.realpath(arg) == os.path.realpath(sys.executable)
    except OSError:
        same = False
    return "<python>" if same else arg


def _fingerprint(argv: tuple[str, ...], env: dict[str, str], input_ids: list[str]) -> str:
    argv = tuple(_interpreter(a) for a in argv[:1]) + tuple(argv[1:])
    payload = json.dumps({"argv": argv, "env": env, "inputs": input_ids}, sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def _finish(steps: list[Step]) -> list[Step]:
    """Fill fingerprints in order; an input an earlier step produced contributes that step's fingerprint."""
    produced: dict[str, str] = {}
    out = []
    for s in steps:
        ids = [produced.get(i) or path_identity(i) for i in s.inputs]
        fp = _fingerprint(s.argv, s.env, ids)
        produced[s.output] = fp
        out.append(Step(s.name, s.description, s.argv, s.output, s.inputs, s.env, fp))
    return out


# -- TensorRT-LLM steps


def _check_flags(argv: list[str], allowed: frozenset[str], tool: str) -> None:
    for a in argv:
        if a.startswith("--") and a not in allowed:
            raise PlanError(f"internal: {tool} in TensorRT-LLM {trtllm.TRTLLM_VERSION} has no flag {a}")


def _checkpoint_step(cfg: BuildConfig, report: PreflightReport, role: str, out: Path, source: str) -> Step:
    """role: target | draft | baseline (the target without heads); source: the HF directory it reads."""
    mode = cfg.speculative.mode
    if role == "target" and mode is Mode.EAGLE:
        return _eagle_checkpoint_step(cfg, report, role, out, source)
    is_medusa = role == "target" and mode is Mode.MEDUSA  # the heads go into the target's checkpoint
    if report.prequantized.get("draft" if role == "draft" else "target") is not None:
        return _prequantized_checkpoint_step(cfg, report, role, out, source)
    if report.quant.weights in DTYPE_FOR_FORMAT and is_medusa:
        return _medusa_checkpoint_step(cfg, report, role, out, source)
    if report.quant.weights in DTYPE_FOR_FORMAT:
        return _convert_checkpoint_step(cfg, report, role, out, source)
    return _quantize_checkpoint_step(cfg, report, role, out, source, is_medusa)


def _eagle_checkpoint_step(cfg: BuildConfig, report: PreflightReport, role: str, out: Path, source: str) -> Step:
    """The target's checkpoint with its EAGLE heads (eagle/convert_checkpoint.py)."""
    model, q, eagle = cfg.target, report.quant, cfg.speculative.eagle
    # fmt: off
    argv = [
        cfg.toolchain.python, str(Path(cfg.toolchain.examples_dir) / "eagle" / "convert_checkpoint.py"),
        "--model_dir", source,
        "--eagle_model_dir", eagle.heads_dir,
        "--output_dir", str(out),
        "--dtype", DTYPE_FOR_FORMAT[q.weights],
        "--tp_size", str(model.tp),
        "--pp_size", str(model.pp),
        "--max_draft_len", str(report.max_draft_len),
        "--num_eagle_layers", str(eagle.num_layers),
        "--max_non_leaves_per_layer", str(eagle.max_non_leaves_per_layer),
    ]
    # fmt: on
    _check_flags(argv, trtllm.EAGLE_CONVERT_FLAGS, "eagle/convert_checkpoint.py")
    what = f"convert {role} + EAGLE heads ({q.weights}, tp{model.tp} pp{model.pp})"
    return _checkpoint(role, what, argv, out, [source, eagle.heads_dir])


def _medusa_checkpoint_step(cfg: BuildConfig, report: PreflightReport, role: str, out: Path, source: str) -> Step:
    """The target's 16-bit checkpoint with its Medusa heads (medusa/convert_checkpoint.py)."""
    model, q, medusa = cfg.target, report.quant, cfg.speculative.medusa
    # fmt: off
    argv = [
        cfg.toolchain.python, str(Path(cfg.toolchain.examples_dir) / "medusa" / "convert_checkpoint.py"),
        "--model_dir", source,
        "--medusa_model_dir", medusa.heads_dir,
        "--output_dir", str(out),
        "--dtype", DTYPE_FOR_FORMAT[q.weights],
        "--tp_size", str(model.tp),
        "--pp_size", str(model.pp),
        "--num_medusa_heads", str(medusa.num_heads),
        "--max_medusa_token_len", str(report.max_draft_len),
    ]
    # fmt: on
    _check_flags(argv, trtllm.MEDUSA_CONVERT_FLAGS, "medusa/convert_checkpoint.py")
    what = f"convert {role} + Medusa heads ({q.weights}, tp{model.tp} pp{model.pp})"
    return _checkpoint(role, what, argv, out, [source, medusa.heads_dir])


def _convert_checkpoint_step(cfg: BuildConfig, report: PreflightReport, role: str, out: Path, source: str) -> Step:
    """A 16-bit checkpoint through the model family's convert_checkpoint.py."""
    model = cfg.draft if role == "draft" else cfg.target
    info = report.draft if role == "draft" else report.target
    q = report.quant
    family = TRTLLM_ARCHITECTURES[info.architecture]
    script = str(Path(cfg.toolchain.examples_dir) / "models" / "core" / family / "convert_checkpoint.py")
    if family == "gemma":  # its own CLI: dashes, --ckpt-type, tensor parallelism only (--world-size)
        # fmt: off
        argv = [
            cfg.toolchain.python, script,
            "--ckpt-type", "hf",
            "--model-dir", source,
            "--output-model-dir", str(out),
            "--dtype", DTYPE_FOR_FORMAT[q.weights],
            "--world-size", str(model.tp),
        ]
        # fmt: on
        _check_flags(argv, trtllm.GEMMA_CONVERT_FLAGS, "gemma/convert_checkpoint.py")
    else:
        # fmt: off
        argv = [
            cfg.toolchain.python, script,
            "--model_dir", source,
            "--output_dir", str(out),
            "--dtype", DTYPE_FOR_FORMAT[q.weights],
            "--tp_size", str(model.tp),
            "--pp_size", str(model.pp),
        ]
        # fmt: on
        _check_flags(argv, trtllm.CONVERT_CHECKPOINT_FLAGS, "convert_checkpoint.py")
    what = f"convert {role} to a TensorRT-LLM checkpoint ({q.weights}, tp{model.tp} pp{model.pp})"
    return _checkpoint(role, what, argv, out, [source])


def _prequantized_checkpoint_step(cfg: BuildConfig, report: PreflightReport, role: str, out: Path, source: str) -> Step:
    """A ModelOpt pre-quantized FP8 checkpoint through llama's convert_checkpoint.py: its weight_scale/input_scale (and
    k/v scales) are loaded as they are, nothing calibrated (upstream-facts: trtllm-convert-prequantized-fp8)."""
    model = cfg.draft if role == "draft" else cfg.target
    q = report.quant
    script = str(Path(cfg.toolchain.examples_dir) / "models" / "core" / "llama" / "convert_checkpoint.py")
    # fmt: off
    argv = [
        cfg.toolchain.python, script,
        "--model_dir", source,
        "--output_dir", str(out),
        "--dtype", model.dtype,
        "--tp_size", str(model.tp),
        "--pp_size", str(model.pp),
        "--use_fp8",
    ]
    # fmt: on
    if q.kv_cache == "fp8":
        argv += ["--fp8_kv_cache"]
    _check_flags(argv, trtllm.PREQUANTIZED_CONVERT_FLAGS, "llama/convert_checkpoint.py")
    kv = " + its FP8 KV-cache scales" if q.kv_cache == "fp8" else ""
    what = f"convert the pre-quantized FP8 {role}{kv}, no calibration (tp{model.tp} pp{model.pp})"
    return _checkpoint(role, what, argv, out, [source])


def _quantize_checkpoint_step(
    cfg: BuildConfig, report: PreflightReport, role: str, out: Path, source: str, is_medusa: bool
) -> Step:
    """ModelOpt post-training quantization (quantization/quantize.py), with the Medusa heads where is_medusa."""
    model = cfg.draft if role == "draft" else cfg.target
    q, medusa = report.quant, cfg.speculative.medusa
    inputs = [source]
    # fmt: off
    argv = [
        cfg.toolchain.python, str(Path(cfg.toolchain.examples_dir) / "quantization" / "quantize.py"),
        "--model_dir", source,
        "--dtype", model.dtype,
        "--qformat", q.weights,
    ]
    # fmt: on
    if q.kv_cache != "none":
        argv += ["--kv_cache_dtype", q.kv_cache]
    if q.weights in QUANTIZE_CALIBRATED or q.kv_cache != "none":
        cq = cfg.quantization
        cal = report.calibration
        if cal is not None and cal.path is not None:  # as preflight resolved it
            argv += ["--calib_dataset", cal.path]
            inputs.append(cal.path)
        # fmt: off
        argv += [
            "--calib_size", str(cq.calib_size),
            "--calib_max_seq_length", str(cq.calib_max_seq_length),
            "--batch_size", str(CALIB_BATCH_SIZE),
        ]
        # fmt: on
    argv += ["--tp_size", str(model.tp), "--pp_size", str(model.pp)]
    if is_medusa:
        # fmt: off
        argv += [
            "--medusa_model_dir", medusa.heads_dir,
            "--num_medusa_heads", str(medusa.num_heads),
            "--max_draft_len", str(report.max_draft_len),
        ]
        # fmt: on
        inputs.append(medusa.heads_dir)
    argv += ["--output_dir", str(out)]
    _check_flags(argv, trtllm.QUANTIZE_FLAGS, "quantize.py")
    # run in-process by the peak recorder: its torch.cuda.max_memory_allocated lands beside the step's log
    peak = out.parent.parent / "logs" / f"checkpoint-{role}{PEAK_SUFFIX}"
    argv[1:1] = ["-m", PEAK_MODULE, "--peak_json", str(peak)]
    if q.weights not in trtllm.QUANTIZE_QFORMATS:
        raise PlanError(f"internal: quantize.py has no --qformat {q.weights}")
    kv = f" + {q.kv_cache.upper()} KV cache" if q.kv_cache != "none" else ""
    what = f"ModelOpt {q.weights.upper()} quantization of the {role}{kv} (tp{model.tp} pp{model.pp})"
    return _checkpoint(role, what, argv, out, inputs)


def _checkpoint(role: str, description: str, argv: list[str], out: Path, inputs: list[str]) -> Step:
    return Step(f"checkpoint-{role}", description, tuple(argv), str(out), tuple(inputs))


def _engine_step(cfg: BuildConfig, report: PreflightReport, role: str, ckpt: Path, out: Path) -> Step:
    model = cfg.draft if role == "draft" else cfg.target
    lim = cfg.limits
    q = report.quant
    ranks_on_node = min(model.world_size, report.gpu.count if report.gpu else model.world_size)
    # fmt: off
    argv = [
        cfg.toolchain.trtllm_build,
        "--checkpoint_dir", str(ckpt),
        "--output_dir", str(out),
        "--max_batch_size", str(lim.max_batch_size),
        "--max_input_len", str(lim.max_input_len),
        "--max_seq_len", str(lim.max_seq_len),
        "--max_num_tokens", str(lim.max_num_tokens),
        "--max_beam_width", "1",
        "--gpt_attention_plugin", "auto",
        "--gemm_plugin", "auto",
        "--remove_input_padding", "enable",
        "--context_fmha", "enable",
        "--kv_cache_type", "paged",
        "--tokens_per_block", str(TOKENS_PER_BLOCK),
        "--use_paged_context_fmha", "enable",
        # what trtllm-build decides anyway, made explicit (upstream-facts: trtllm-build-fp8-context-fmha)
        "--use_fp8_context_fmha", "enable" if q.fp8_context_fmha else "disable",
        # FP16 logits clamp into ties at low temperature (upstream-facts: trtllm-temperature-clamp)
        "--logits_dtype", LOGITS_DTYPE,
    ]
    # fmt: on
    mode = cfg.speculative.mode
    what = "engine"
    if role == "target" and mode != "none":
        argv += ["--speculative_decoding_mode", SPEC_MODE_TO_TRTLLM[mode], "--max_draft_len", str(report.max_draft_len)]
        what = f"{SPEC_MODE_TO_TRTLLM[mode]} engine, max_draft_len {report.max_draft_len}"
    if gathers_generation_logits(cfg, role):
        argv += ["--gather_generation_logits"]
        what += (
            " with generation logits (rejection sampling)"
            if role == "draft"
            else " with generation logits (check's near-tie probe)"
        )
    argv += ["--workers", str(ranks_on_node)]
    _check_flags(argv, trtllm.TRTLLM_BUILD_FLAGS, "trtllm-build")
    if "--gather_context_logits" in argv and report.max_draft_len > 0:
        raise PlanError("internal: --gather_context_logits with max_draft_len > 0 is rejected by trtllm-build")
    return Step(
        f"engine-{role}",
        f"trtllm-build {role} {what} ({model.world_size} rank(s))",
        tuple(argv),
        str(out),
        (str(ckpt),),
    )


# What import/distill write for GPU engines: quantize.py --dtype auto turns float32 into float16, and the LLM API
# serves the directory's dtype with 16-bit attention.
GPU_SOURCE_DTYPE = "bfloat16"


def _source_steps(cfg: BuildConfig, out: Path, dtype: Optional[str] = None) -> tuple[list[Step], dict[str, str]]:
    """Steps making the HF directories a config names but lacks (import-target from GGUF, distill-draft), and
    role -> HF directory. dtype: what they save (None: float32)."""
    py = sys.executable
    steps: list[Step] = []
    hf: dict[str, str] = {}
    as_dtype = ("--dtype", dtype) if dtype else ()
    target_src = cfg.target.checkpoint
    if is_imported(target_src):
        hf["target"] = str(out / "hf" / "target")
        steps.append(
            Step(
                "import-target",
                f"convert {target_src} to a Hugging Face directory (dequantized {dtype or 'fp32'})",
                (py, "-m", "trt_spec.reference.checkpoints", "--source", target_src, "--output_dir", hf["target"])
                + as_dtype,
                hf["target"],
                (target_src,),
            )
        )
    else:
        hf["target"] = target_src
    if cfg.draft is not None:
        d = cfg.draft.distill
        if d is not None:
            hf["draft"] = str(out / "hf" / "draft")
            # fmt: off
            argv = (
                py, "-m", "trt_spec.reference.distill",
                "--teacher", hf["target"],
                "--output_dir", hf["draft"],
                "--hidden", str(d.hidden_size),
                "--layers", str(d.num_layers),
                "--steps", str(d.steps),
                "--seed", str(d.seed),
            ) + as_dtype
            # fmt: on
            steps.append(
                Step(
                    "distill-draft",
                    f"distill a {d.num_layers}-layer, {d.hidden_size}-wide draft from the "
                    f"target ({d.steps} steps, seed {d.seed})",
                    argv,
                    hf["draft"],
                    (hf["target"],),
                )
            )
        else:
            hf["draft"] = cfg.draft.checkpoint
    return steps, hf


def _reference_steps(cfg: BuildConfig, report: PreflightReport, out: Path) -> tuple[list[Step], dict[str, str]]:
    """import -> distill-draft or train-eagle (optional) -> export-draft -> export-target -> export-baseline."""
    steps, hf = _source_steps(cfg, out)
    head_dir = None
    eg = cfg.speculative.eagle if "train-eagle" in cfg.recipe.steps else None
    if eg is not None and eg.train is not None:
        head_dir = str(out / "heads" / "eagle3")
        steps.append(_train_eagle_step(eg.train, report, hf["target"], head_dir))
    elif eg is not None:
        head_dir = eg.heads_dir
    engines = {}
    hf["baseline"] = hf["target"]
    for role in sorted(engine_roles(cfg), key=["draft", "target", "baseline"].index):
        edir = out / "engines" / role
        steps.append(_export_step(cfg, report, role, hf[role], edir, head_dir))
        engines[role] = str(edir)
    return steps, engines


def _train_eagle_step(t: EagleTrain, report: PreflightReport, target: str, head_dir: str) -> Step:
    """Train an EAGLE-3 head for the target into head_dir."""
    # fmt: off
    argv = (
        sys.executable, "-m", "trt_spec.reference.train_eagle",
        "--target", target,
        "--output_dir", head_dir,
        "--weights", report.quant.weights,
        "--draft_vocab", str(t.draft_vocab),
        "--steps", str(t.steps),
        "--seed", str(t.seed),
    ) + (("--prompts", str(t.prompts)) if t.prompts else ())
    # fmt: on
    return Step(
        "train-eagle",
        f"train an EAGLE-3 head for the target by self-distillation ({t.steps} steps, seed {t.seed})",
        argv,
        head_dir,
        (target,),
    )


def _export_step(
    cfg: BuildConfig, report: PreflightReport, role: str, checkpoint: str, edir: Path, head_dir: Optional[str]
) -> Step:
    """One role's reference engine from its HF checkpoint (the target's with the EAGLE-3 head, if any)."""
    lim = cfg.limits
    # fmt: off
    argv = (
        sys.executable, "-m", "trt_spec.reference.export",
        "--checkpoint", checkpoint,
        "--output_dir", str(edir),
        "--weights", report.quant.weights,
        "--max_batch_size", str(lim.max_batch_size),
        "--max_seq_len", str(lim.max_seq_len),
        "--max_num_tokens", str(lim.max_num_tokens),
        "--logits_dtype", LOGITS_DTYPE,
    )
    # fmt: on
    if gathers_generation_logits(cfg, role):  # the stand-in refuses logits without it, as the executor does
        argv += ("--gather_generation_logits",)
    # The target's limits as trtllm-build bakes them (max_draft_len also clamps output length: OUTPUT_LEN_CLAMPED).
    if role == "target" and cfg.speculative.mode != "none":
        # fmt: off
        argv += (
            "--speculative_decoding_mode", SPEC_MODE_TO_TRTLLM[cfg.speculative.mode],
            "--max_draft_len", str(report.max_draft_len),
        )
        # fmt: on
    inputs: tuple[str, ...] = (checkpoint,)
    if role == "target" and head_dir is not None:
        # the chain uses the loop's draft-length policy
        argv += ("--eagle_head", head_dir, "--eagle_draft_policy", cfg.speculative.draft_len_policy.value)
        inputs += (head_dir,)
    return Step(
        f"export-{role}",
        f"export the {role} to a reference engine ({report.quant.weights} "
        "weights, safetensors" + (", with its EAGLE-3 head" if role == "target" and head_dir else "") + ")",
        argv,
        str(edir),
        inputs,
    )


def engine_roles(cfg: BuildConfig) -> list[str]:
    """The engines a config builds: target, draft (draft-target) and baseline (in-engine modes' ensemble)."""
    return (
        ["target"]
        + (["draft"] if cfg.draft is not None else [])
        + (["baseline"] if cfg.speculative.has_baseline_engine else [])
    )


def baseline_role(cfg: BuildConfig) -> Optional[str]:
    """The engine the ensemble (the baseline) serves; None where it would be a speculating target."""
    if cfg.speculative.has_baseline_engine:
        return "baseline"
    return None if cfg.speculative.mode.in_engine else "target"


def gathers_generation_logits(cfg: BuildConfig, role: str) -> bool:
    """Whether an engine gets --gather_generation_logits: the baseline's (`trt-spec check` probes its logits) and a
    draft whose logits rejection sampling uses (NO_GENERATION_LOGITS)."""
    return role == baseline_role(cfg) or (role == "draft" and cfg.speculative.use_draft_logits)


def llmapi_models(cfg: BuildConfig, sources: Optional[dict[str, str]] = None) -> dict[str, str]:
    """runtime llmapi: role -> the checkpoint directory it serves as is (the draft role may be an EAGLE-3 head).
    sources: import/distill outputs, which replace the configured ones."""
    sources = sources or {}
    out = {"target": sources.get("target", cfg.target.checkpoint)}
    if cfg.draft is not None:
        out["draft"] = sources.get("draft", cfg.draft.checkpoint)
    elif "heads" in cfg.recipe.models:  # eagle3
        out["draft"] = cfg.speculative.eagle3.heads_dir
    return out


def make_plan(cfg: BuildConfig, report: PreflightReport, source: Path | None) -> Plan:
    out = cfg.resolved_output_dir(source)
    name = cfg.resolved_name(source)
    rec = cfg.recipe
    if "export" in rec.steps:
        steps, engines = _reference_steps(cfg, report, out)
        return Plan(name, cfg.config_hash(), cfg.engine, str(out), report.gpu, report, _finish(steps), engines)
    # a GGUF target / a distilled draft: made first, then used as any checkpoint
    pre, hf = _source_steps(cfg, out, GPU_SOURCE_DTYPE)
    sources = {s.name.split("-", 1)[1]: s.output for s in pre}
    if "engine" not in rec.steps:  # runtime llmapi: nothing to build
        return Plan(
            name,
            cfg.config_hash(),
            cfg.engine,
            str(out),
            report.gpu,
            report,
            _finish(pre),
            llmapi_models(cfg, sources),
            sources,
        )
    roles = engine_roles(cfg)
    ckpts = {r: out / "checkpoints" / r for r in roles}
    if "baseline" in roles and cfg.speculative.mode is Mode.LOOKAHEAD:
        ckpts["baseline"] = ckpts["target"]  # lookahead's target checkpoint is the plain model
    engs = {r: out / "engines" / r for r in roles}
    src = {r: hf["draft" if r == "draft" else "target"] for r in roles}
    steps = pre + [
        _checkpoint_step(cfg, report, r, ckpts[r], src[r])
        for r in roles
        if r == "target" or ckpts[r] != ckpts["target"]
    ]
    # Draft engine first: small, it fails fast on a broken toolchain.
    steps += [_engine_step(cfg, report, r, ckpts[r], engs[r]) for r in reversed(roles)]
    return Plan(
        name,
        cfg.config_hash(),
        cfg.engine,
        str(out),
        report.gpu,
        report,
        _finish(steps),
        {r: str(p) for r, p in engs.items()},
        {r: p for r, p in src.items() if r in sources or (r == "baseline" and "target" in sources)},
    )
