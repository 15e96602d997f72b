"""`trt-spec deploy k8s`: a build manifest (or a config's plan) -> a Helm chart for the GPU deployment.

The templates are static package data (deploy/chart/templates); this module writes values.yaml (`plan` holds the
build's facts, the rest are knobs) and prometheus-adapter values, after checking the plan fits the nodes
(upstream-facts: k8s-autoscaling-guide).
"""

from __future__ import annotations

import json
import math
import re
import shlex
import shutil
from dataclasses import dataclass
from pathlib import Path
from string import Template
from typing import Iterable, Optional

import yaml

from .. import __version__
from ..builder.model_info import is_imported
from ..builder.trtllm import NGC_IMAGE
from ..errors import TrtSpecError
from ..records import defaults
from ..records.atomic import replacing_dir
from ..records.manifest import BuildManifest, ManifestError
from ..records.speculation import break_even_acceptance

CHART_SOURCES = Path(__file__).parent / "chart"
ADAPTER_VALUES = "prometheus-adapter-values.yaml"
ADMIN_KEY_FILE = "/var/run/trt-spec/admin/key"
OPENAI_KEY_FILE = "/var/run/trt-spec/openai/key"  # from server.openaiApiKeySecret
TRITON_UID = 1000  # (upstream-facts: tritonserver-image-uid)


class DeployError(TrtSpecError, ValueError):
    """Bad input for a deployment bundle."""


@dataclass(frozen=True)
class Layout:
    """How the plan's GPUs land on nodes."""

    ranks: int  # target TP x PP plus the draft's own GPUs
    gpus_per_node: int
    single_process: bool  # no mpirun


# Refused rather than half-supported: multi-node needs leader mode, which rules out the orchestrator mode a draft
# beside a multi-GPU target needs (upstream-facts: multi-node-leader-mode).
MULTI_NODE_REFUSED = (
    "{name}: the plan needs {ranks} GPUs but nodes have {per}; trt-spec serves a replica on one node "
    "(multi-node launch is not supported here): use nodes with >= {ranks} GPUs, or lower the target's "
    "tp x pp; a runtime: llmapi config runs across nodes with trt-spec deploy dynamo or deploy trtllm-serve"
)


@dataclass(frozen=True)
class Acceptance:
    k: int  # served default draft length
    c: float  # draft cost per token, in target decode steps
    r: float  # verification cost, in decode steps
    threshold: float
    why: str


# ---------------------------------------------------------------------------------------------------------
# What the build says


def load_manifest(source: Path, sets: Iterable[str] = (), gpu: Optional[str] = None) -> BuildManifest:
    """The manifest of BUILD_DIR, or CONFIG's plan; refuses a CPU deployment.

    Raises DeployError, or ConfigError/PreflightError/HardwareError from planning."""
    from ..builder.pipeline import manifest_from

    source = Path(source)
    if not source.exists():
        raise DeployError(
            f"{source}: no such build directory or config; pass a build directory (build/NAME, "
            "written by trt-spec build) or a config from build_configs/"
        )
    try:
        m = manifest_from(source, tuple(sets), gpu)
    except ManifestError as e:
        raise DeployError(str(e)) from None
    if not m.deployment.gpu:
        raise DeployError(
            f"{source}: engine {m.engine!r} is the CPU reference deployment; the Kubernetes bundle is "
            "for the GPU deployment (engine: tensorrt): pass a GPU config such as "
            "build_configs/llama33-70b-fp8-h200.yaml, or serve this one with trt-spec serve / make demo"
        )
    return m


def plan_ranks(m: BuildManifest) -> int:
    """GPUs the deployment needs: target and draft devices, shared ones counted once."""
    pl = m.deployment.placement
    return len(set(pl.target_devices) | set(pl.draft_devices)) or pl.world_size.target


def layout(m: BuildManifest, gpus_per_node: Optional[int] = None) -> Layout:
    """Raises DeployError when the plan's GPUs cannot be placed on nodes of gpus_per_node GPUs (default: the GPU
    count the plan was made for, at most defaults.GPUS_PER_NODE)."""
    from ..repository.writer import mpi_ranks, orchestrator

    ranks = plan_ranks(m)
    per = gpus_per_node if gpus_per_node is not None else min(m.gpu.count if m.gpu else ranks, defaults.GPUS_PER_NODE)
    if per < 1:
        raise DeployError(f"--gpus-per-node must be >= 1, got {per}")
    if ranks > per:
        raise DeployError(MULTI_NODE_REFUSED.format(name=m.name, ranks=ranks, per=per))
    return Layout(ranks, per, mpi_ranks(m.deployment, m.engines) == 1 and not orchestrator(m.engines))


def model_sizes(m: BuildManifest) -> tuple[int, Optional[int]]:
    """(target, draft) parameter counts, from the model facts the build recorded."""
    models = m.deployment.models
    return models.target.num_params, models.draft.num_params if models.draft else None


@dataclass(frozen=True)
class BuildResources:
    gpus: int
    memory_gib: int
    why: str  # the comment values.yaml carries


def build_resources(m: BuildManifest, lay: Layout, gpus_per_node_given: bool) -> BuildResources:
    """The build Job's GPUs (enough for calibration's 16-bit peak) and host memory (the 16-bit checkpoint).

    Raises DeployError when a given --gpus-per-node cannot hold the calibration."""
    from ..builder.prequant import prequant_for
    from ..records.memory import GIB, calibration_peak

    gpus = min(lay.ranks, lay.gpus_per_node)
    target_params, _ = model_sizes(m)
    weights16 = target_params * 2 / GIB
    memory = int(math.ceil((weights16 * 1.25 + 32) / 16) * 16)
    weights = m.engines["target"].weights if "target" in m.engines else ""
    if m.deployment.recipe.llm_api:  # builds at load: the Job only writes the repository
        return BuildResources(gpus, 64, "runtime llmapi builds nothing ahead: the serving pod's GPUs, 64 GiB")
    if m.gpu is None or weights in ("bf16", "fp16", "fp32"):
        return BuildResources(
            gpus,
            memory,
            f"no calibration ({weights}): the serving pod's GPUs; host memory for the "
            f"{weights16:.0f} GiB 16-bit checkpoint the conversion reads",
        )
    models = m.deployment.models  # quantize.py runs on each model not pre-quantized, one at a time
    pairs = ((models.target, m.config.target), (models.draft, m.config.draft))
    quantized = [i for i, c in pairs if i is not None and c is not None and prequant_for(c.checkpoint) is None]
    if not quantized:
        return BuildResources(gpus, memory, f"{weights} pre-quantized: converted, no calibration; the serving GPUs")
    biggest = max(quantized, key=lambda i: i.num_params)
    cal = calibration_peak(biggest, defaults.CALIB_BATCH_SIZE, m.config.quantization.calib_max_seq_length)
    peak = cal.ceiling_gib(cal.gpus_needed(m.gpu.memory_gib))
    need = max(gpus, cal.gpus_needed(m.gpu.memory_gib))
    if gpus_per_node_given and need > lay.gpus_per_node:
        raise DeployError(
            f"{m.name}: calibrating for {weights} holds up to ~{peak:.0f} GiB (16-bit weights + a calibration "
            f"batch + per-GPU headroom), {need} x {m.gpu.name} ({m.gpu.memory_gib:.0f} GiB each), but "
            f"--gpus-per-node is {lay.gpus_per_node}; build on nodes with >= {need} GPUs "
            f"(--gpus-per-node {need}), or quantize elsewhere and point target.checkpoint at the result"
        )
    return BuildResources(
        need,
        memory,
        f"{weights} calibration holds up to ~{peak:.0f} GiB (16-bit weights + a batch + per-GPU headroom): "
        f"{need} x {m.gpu.name} ({m.gpu.memory_gib:.0f} GiB); host memory for the "
        f"{weights16:.0f} GiB 16-bit checkpoint",
    )


def acceptance(m: BuildManifest, min_acceptance: Optional[float] = None) -> Acceptance:
    """Break-even acceptance a* = c + (r - 1) / k at the served k.

    c = draft/target parameters (decode is bandwidth-bound), 0 for draft-free modes; r = 1 on a GPU."""
    k = m.speculation.num_draft_tokens
    r = defaults.VERIFY_COST_GPU
    if m.speculation.mode.draft_free:
        c, why = 0.0, f"{m.speculation.mode}: no draft model (c = 0)"
    else:
        target, draft = model_sizes(m)
        if draft is None:
            raise DeployError(f"{m.name}: draft-target mode without a draft checkpoint; set draft.checkpoint")
        c = draft / target
        why = f"c = draft/target parameters = {draft / 1e9:.2f}B / {target / 1e9:.2f}B"
    if k < 1:
        raise DeployError(f"{m.name}: the served draft length is {k}; set speculative.num_draft_tokens >= 1")
    threshold = break_even_acceptance(k, c, r) if min_acceptance is None else float(min_acceptance)
    if min_acceptance is not None:
        why += f"; overridden by --min-acceptance (break-even: {break_even_acceptance(k, c, r):.4g})"
    return Acceptance(k, c, r, threshold, why)


# ---------------------------------------------------------------------------------------------------------
# The launch


def pod_paths(m: BuildManifest) -> dict[str, str]:
    mount = defaults.K8S_MOUNT_PATH
    return {
        "mountPath": mount,
        "buildDir": f"{mount}/build/{m.name}",
        "repository": f"{mount}/repo/{m.name}",
        "config": f"/etc/trt-spec/{m.name}.yaml",
    }


def launch(m: BuildManifest, repository: str, *, admin_key: bool):
    """trt-spec's launch argv for the repository's pod path, computed from the manifest alone."""
    from ..repository.writer import repo_record
    from ..serve.launch import ServedRepository, launch_spec
    from ..serve.locate import NGC_TRITONSERVER

    spec = launch_spec(
        ServedRepository(Path(repository), repo_record(m)),
        binary=NGC_TRITONSERVER,
        host="0.0.0.0",
        admin_key_file=Path(ADMIN_KEY_FILE) if admin_key else None,
        shm_prefix="trtspec_",
    )
    return list(spec.argv), spec


# ---------------------------------------------------------------------------------------------------------
# Files


def chart_name(m: BuildManifest) -> str:
    name = re.sub(r"[^a-z0-9-]+", "-", m.name.lower()).strip("-")
    return name or "trt-spec"


def build_config_text(m: BuildManifest, paths: dict[str, str], gpu: Optional[str]) -> str:
    """The config the build Job reads, with output_dir on the claim."""
    data = m.config.model_dump(mode="json")
    data["name"] = m.name
    data["output_dir"] = paths["buildDir"]
    if gpu:
        data["gpu"] = gpu
    return yaml.safe_dump(data, sort_keys=False)


def build_script(paths: dict[str, str]) -> str:
    cli = "python3 -m trt_spec.cli"
    return (
        "\n".join(
            [
                "set -euo pipefail",
                f"{cli} build {shlex.quote(paths['config'])}",
                f"{cli} repo {shlex.quote(paths['buildDir'])} --out {shlex.quote(paths['repository'])}",
            ]
        )
        + "\n"
    )


def _j(v) -> str:
    return json.dumps(v)


VALUES_TEMPLATE = Path(__file__).parent / "values.yaml.in"


class _PlanDumper(yaml.SafeDumper):
    """Multi-line strings as literal blocks."""


_PlanDumper.add_representer(
    str, lambda d, v: d.represent_scalar("tag:yaml.org,2002:str", v, style="|" if "\n" in v else None)
)


def plan_values(m: BuildManifest, lay: Layout, acc: Acceptance, *, gpu: Optional[str], env: dict) -> dict:
    """values.yaml's `plan` block: the build's facts the templates read."""
    paths = pod_paths(m)
    return {
        "name": m.name,
        "configHash": m.config_hash,
        "ranks": lay.ranks,
        "singleProcess": lay.single_process,
        "speculativeMode": m.speculation.mode.value,
        "numDraftTokens": acc.k,
        "queueComputeMetric": defaults.QUEUE_COMPUTE_METRIC,
        "queueComputeRule": QUEUE_COMPUTE_RULE,
        "adminKeyFile": ADMIN_KEY_FILE,
        "openaiKeyFile": OPENAI_KEY_FILE,
        "ports": {
            "http": defaults.HTTP_PORT,
            "grpc": defaults.GRPC_PORT,
            "metrics": defaults.METRICS_PORT,
            "openai": defaults.OPENAI_PORT,
        },
        "paths": dict(paths),
        "env": dict(env),
        "buildScript": build_script(paths),
        "buildConfig": build_config_text(m, paths, gpu),
    }


def values_yaml(m: BuildManifest, source: Path, lay: Layout, acc: Acceptance, *, gpu: Optional[str]) -> str:
    """values.yaml: the knobs from values.yaml.in, then the `plan` block."""
    paths = pod_paths(m)
    argv, spec = launch(m, paths["repository"], admin_key=False)
    res = build_resources(m, lay, False)
    image, tag = NGC_IMAGE.rsplit(":", 1)
    checkpoints = [m.config.target.checkpoint] + (
        [m.config.draft.checkpoint] if m.config.draft and m.config.draft.checkpoint else []
    )
    knobs = Template(VALUES_TEMPLATE.read_text()).substitute(
        name=m.name,
        version=__version__,
        source=source,
        trtllm_version=m.tool_versions.get("tensorrt_llm") or "1.2.1",
        image=image,
        tag=_j(tag),
        mount_path=paths["mountPath"],
        pip_install=_j(
            f"--no-deps --no-index --find-links {paths['mountPath']}/wheels trt-spec rich markdown-it-py mdurl"
        ),
        gpus_per_node=lay.gpus_per_node,
        shm_size=defaults.K8S_SHM_SIZE,
        checkpoints=", ".join(checkpoints),
        build_gpus=res.gpus,
        build_memory=f"{res.memory_gib}Gi",
        build_why=res.why,
        startup_s=defaults.K8S_STARTUP_PERIOD_S * defaults.K8S_STARTUP_FAILURES,
        startup_period_s=defaults.K8S_STARTUP_PERIOD_S,
        startup_failures=defaults.K8S_STARTUP_FAILURES,
        http_port=defaults.HTTP_PORT,
        grpc_port=defaults.GRPC_PORT,
        metrics_port=defaults.METRICS_PORT,
        openai_port=defaults.OPENAI_PORT,
        openai_enabled="true" if m.deployment.recipe.openai else "false",
        openai_key_secret=f"{m.name}-openai-key",
        drain_timeout_s=int(defaults.DRAIN_TIMEOUT_S),
        stop_margin_s=int(defaults.DRAIN_CUT_GRACE_S + defaults.EXIT_TIMEOUT_S + 5),
        uid=TRITON_UID,
        k=acc.k,
        r=acc.r,
        why=acc.why,
        min_acceptance=repr(acc.threshold),
    )
    dev = m.deployment.placement
    draft = f", draft on GPU(s) {dev.draft_devices}" if m.draft else ""
    shown = shlex.join(argv).replace(spec.admin_key, spec.admin_key_shown)
    plan = yaml.dump(
        {"plan": plan_values(m, lay, acc, gpu=gpu, env=spec.env)}, Dumper=_PlanDumper, sort_keys=False, width=1000
    )
    return (
        f"{knobs}\n# -- The build's facts (do not edit: regenerate with trt-spec deploy k8s).\n"
        f"# GPUs: target TP{m.target.tp} x PP{m.target.pp} on GPU(s) {dev.target_devices}{draft}. A pod runs "
        f"`trt-spec serve`, which runs (trt-spec serve --dry-run):\n#   {shown}\n{plan}"
    )


# queued over computing time, per series (upstream-facts: k8s-queue-compute-rule)
QUEUE_COMPUTE_RULE = (
    "rate(nv_inference_queue_duration_us[1m]) / clamp_min(rate(nv_inference_compute_infer_duration_us[1m]), 1)"
)


def adapter_values_yaml() -> str:
    """prometheus-adapter values that serve the recorded ratio to the HPA."""
    name = defaults.QUEUE_COMPUTE_METRIC
    query = "sum by (<<.GroupBy>>) (<<.Series>>{<<.LabelMatchers>>})"
    return f"""\
# prometheus-adapter values: the custom metric {name} the chart's HPA scales on, as NVIDIA's Triton autoscaling
# tutorial names it. The chart's PrometheusRule records it from Triton's counters:
#   {name} = {QUEUE_COMPUTE_RULE}
#   helm upgrade --install -n monitoring prometheus-adapter prometheus-community/prometheus-adapter \\
#     --set prometheus.url=http://prometheus-kube-prometheus-prometheus -f {ADAPTER_VALUES}
# Check: kubectl get --raw "/apis/custom.metrics.k8s.io/v1beta1/namespaces/NAMESPACE/pods/*/{name}"
metricsRelistInterval: 6s
rules:
  default: false
  custom:
    - seriesQuery: {_j(name + '{namespace!="",pod!=""}')}
      resources:
        overrides:
          namespace: {{resource: namespace}}
          pod: {{resource: pod}}
      name:
        matches: {_j("^" + name + "$")}
        as: {_j(name)}
      metricsQuery: {_j(query)}
"""


def chart_yaml(m: BuildManifest) -> str:
    tag = NGC_IMAGE.rsplit(":", 1)[1]
    return f"""\
apiVersion: v2
name: {chart_name(m)}
description: {_j(f"trt-spec speculative decoding deployment {m.name} ({m.speculation.mode}) on Triton + TensorRT-LLM")}
type: application
version: {__version__}
appVersion: {_j(tag)}
kubeVersion: ">=1.27.0-0"
"""


def write_chart(
    source: Path,
    out: Path,
    *,
    gpus_per_node: Optional[int] = None,
    min_acceptance: Optional[float] = None,
    sets: Iterable[str] = (),
    gpu: Optional[str] = None,
) -> Path:
    """Write the chart to `out` atomically, after every check; returns `out`."""
    m = load_manifest(source, sets, gpu)
    cfg = m.config
    if is_imported(cfg.target.checkpoint) or (cfg.draft is not None and cfg.draft.distill is not None):
        raise DeployError(
            f"{m.name}: a GGUF target or a distilled draft is built on one host (the first-contact "
            "configs, make gpu-smoke), not by a cluster's build Job; deploy a config whose target.checkpoint "
            "and draft.checkpoint are Hugging Face directories"
        )
    lay = layout(m, gpus_per_node)
    build_resources(m, lay, gpus_per_node is not None)  # may refuse
    if min_acceptance is not None and not 0.0 <= min_acceptance <= 1.0:
        raise DeployError(f"--min-acceptance must be in [0, 1], got {min_acceptance}")
    acc = acceptance(m, min_acceptance)
    files = {
        "Chart.yaml": chart_yaml(m),
        "values.yaml": values_yaml(m, Path(source), lay, acc, gpu=gpu),
        ADAPTER_VALUES: adapter_values_yaml(),
    }
    out = Path(out)
    if out.exists() and not (out / "Chart.yaml").is_file():
        if not out.is_dir() or any(out.iterdir()):
            raise DeployError(f"{out}: exists and is not a chart trt-spec wrote; pass an empty or new --out directory")
    with replacing_dir(out) as tmp:
        shutil.copytree(CHART_SOURCES, tmp, ignore=shutil.ignore_patterns("__pycache__"))
        for name, text in files.items():
            (tmp / name).write_text(text)
    return out
