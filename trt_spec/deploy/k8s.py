"""Kubernetes bundle: a build manifest (or a config's plan) -> a Helm chart for the GPU deployment.

`trt-spec deploy k8s BUILD_DIR|CONFIG --out DIR` writes DIR/ as a Helm chart (Chart.yaml, values.yaml, templates/)
plus DIR/prometheus-adapter-values.yaml, following NVIDIA's guide (triton-inference-server/tutorials,
Deployment/Kubernetes/TensorRT-LLM_Autoscaling_and_Load_Balancing): the pinned NGC image, a PersistentVolumeClaim
with a Job that runs `trt-spec build` and `trt-spec repo` into it, one Deployment (one pod per replica, on one node)
serving with trt-spec's own launch, a Service, a PodMonitor, an HPA on Triton's queue-to-compute ratio, a PodDisruptionBudget and an alert on speculative acceptance.

The templates are static package data (trt_spec/deploy/chart/templates); this module writes what the build decides
(values.yaml: `plan` holds the facts, everything else is a knob) and checks, before writing anything, that the
plan fits the nodes. Helm renders the templates; the tests render them with Helm's own engine and validate every
object against the Kubernetes and CRD schemas.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shlex
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Optional

import yaml

from .. import __version__
from ..records import defaults
from ..records.atomic import replacing_dir
from ..records.speculation import Mode, break_even_acceptance
from ..records.manifest import BuildManifest, ManifestError
from ..build.trtllm import NGC_IMAGE

CHART_SOURCES = Path(__file__).parent / "chart"
ADAPTER_VALUES = "prometheus-adapter-values.yaml"
ADMIN_KEY_FILE = "/var/run/trt-spec/admin/key"
TRITON_UID = 1000  # user triton-server in NVIDIA's tritonserver images (see values.yaml: podSecurityContext)


class DeployError(ValueError):
    """Bad input for a deployment bundle: one line naming the problem and the fix."""


@dataclass(frozen=True)
class Layout:
    """How the plan's GPUs land on nodes."""

    ranks: int  # GPUs the plan needs: target TP x PP, plus the draft's own GPUs where it has them
    gpus_per_node: int
    single_process: bool  # one tritonserver process holds every GPU (no mpirun)


# Multi-node serving is refused, not half-supported. NVIDIA's multi-node launch (triton-inference-server/tutorials
# Deployment/Kubernetes EKS and LeaderWorkerSet guides) runs the tensorrtllm backend in leader mode under
# `mpirun --host pod0:G,pod1:G -mca plm_rsh_agent kubessh` (kubectl exec: kubectl in the image and pods/exec RBAC; the
# NGC image has no sshd), sets `num_nodes` whenever `gpu_device_ids` is set (the executor checks deviceIds x numNodes
# == tp x pp) and cannot use orchestrator mode (`--multi-model`: single node only, tensorrtllm_backend README), which
# trt-spec needs for a draft beside a multi-GPU target. None of that can be tried here; a chart that cannot start
# would be worse than this line.
MULTI_NODE_REFUSED = ("{name}: the plan needs {ranks} GPUs but nodes have {per}; trt-spec serves a replica on one node "
                      "(multi-node launch is not supported): use nodes with >= {ranks} GPUs, or lower the target's "
                      "tp x pp")


@dataclass(frozen=True)
class Acceptance:
    k: int  # the served default draft length
    c: float  # draft cost per token in target decode steps
    r: float  # verification cost in decode steps
    threshold: float  # break_even_acceptance(k, c, r), or the --min-acceptance override
    why: str


# ---------------------------------------------------------------------------------------------------------
# What the build says


def load_manifest(source: Path, sets: Iterable[str] = (), gpu: Optional[str] = None) -> BuildManifest:
    """BUILD_DIR (its manifest.json) or CONFIG (its plan, before the build). Refuses a CPU (reference) deployment.
    Raises DeployError, or ConfigError/PreflightError/HardwareError from planning a config (one line each)."""
    from ..build.pipeline import manifest_from

    source = Path(source)
    if not source.exists():
        raise DeployError(f"{source}: no such build directory or config; pass a build directory (build/NAME, "
                          "written by trt-spec build) or a config from build_configs/")
    try:
        m = manifest_from(source, tuple(sets), gpu)
    except ManifestError as e:
        raise DeployError(str(e)) from None
    if m.engine != "tensorrt":
        raise DeployError(f"{source}: engine {m.engine!r} is the CPU reference deployment; the Kubernetes bundle is "
                          "for the GPU deployment (engine: tensorrt): pass a GPU config such as "
                          "build_configs/llama33-70b-fp8-h200.yaml, or serve this one with trt-spec serve / make demo")
    return m


def plan_ranks(m: BuildManifest) -> int:
    """GPUs the deployment needs: the target's devices (TP x PP) and the draft's, counted once where shared."""
    return len(set(m.runtime.target_devices) | set(m.runtime.draft_devices)) or m.world_size.target


def layout(m: BuildManifest, gpus_per_node: Optional[int] = None) -> Layout:
    """Raises DeployError when the plan's GPUs cannot be placed on nodes of gpus_per_node GPUs (default: the GPU
    count the plan was made for)."""
    from ..serve.repository import RepoSettings, mpi_ranks

    ranks = plan_ranks(m)
    per = gpus_per_node if gpus_per_node is not None else (m.gpu.count if m.gpu else ranks)
    if per < 1:
        raise DeployError(f"--gpus-per-node must be >= 1, got {per}")
    if ranks > per:
        raise DeployError(MULTI_NODE_REFUSED.format(name=m.name, ranks=ranks, per=per))
    s = RepoSettings.from_manifest(m)
    return Layout(ranks, per, mpi_ranks(s) == 1 and not s.orchestrator)


def model_sizes(m: BuildManifest) -> tuple[int, Optional[int]]:
    """(target, draft) parameter counts from the checkpoints' config.json, else the built-in model table."""
    from ..build.model_info import model_info_for

    cfg = m.config
    target = model_info_for(cfg.target.checkpoint, "target", False).num_params
    draft = model_info_for(cfg.draft.checkpoint, "draft", False).num_params if cfg.draft and cfg.draft.checkpoint \
        else None
    return target, draft


def acceptance(m: BuildManifest, min_acceptance: Optional[float] = None) -> Acceptance:
    """The acceptance under which speculation at the served k loses: a* = c + (r - 1) / k with r = 1 (a GPU at
    small batch verifies k+1 tokens in about one decode step) and c = draft/target parameters (decode is
    bandwidth-bound: a step costs what its weights weigh), 0 for draft-free modes."""
    k = m.speculative.num_draft_tokens
    r = defaults.VERIFY_COST_GPU
    if Mode(m.speculative.mode).draft_free:
        c, why = 0.0, f"{m.speculative.mode}: no draft model (c = 0)"
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
# The launch: trt-spec's own (trt_spec/serve/server.py launch_spec), as `trt-spec serve --dry-run` prints it


def pod_paths(m: BuildManifest) -> dict[str, str]:
    mount = defaults.K8S_MOUNT_PATH
    return {"mountPath": mount, "buildDir": f"{mount}/build/{m.name}", "repository": f"{mount}/repo/{m.name}",
            "config": f"/etc/trt-spec/{m.name}.yaml"}


def launch(m: BuildManifest, repository: str, *, admin_key: bool):
    """trt-spec's launch command for this deployment, with the repository at its path in the pod: world size and
    orchestrator mode come from the repository record, as on a GPU host (the repository is written to a temporary
    directory to read them; engines are not hashed here)."""
    from ..serve.repository import write_repository
    from ..serve.server import NGC_TRITONSERVER, launch_spec

    unsummed = dataclasses.replace(m, engines={r: dataclasses.replace(e, files=None) for r, e in m.engines.items()})
    with tempfile.TemporaryDirectory(prefix="trt-spec-k8s-") as tmp:
        repo = Path(tmp) / "repo"
        write_repository(unsummed, repo)
        spec = launch_spec(repo, binary=NGC_TRITONSERVER, host="0.0.0.0", admin_key_file=Path(ADMIN_KEY_FILE)
                           if admin_key else None)
        where = str(repo.resolve())
    argv = [a.replace(where, repository).replace(spec.shm_prefix, "trtspec_") for a in spec.argv]
    return argv, spec


# ---------------------------------------------------------------------------------------------------------
# Files


def chart_name(m: BuildManifest) -> str:
    name = re.sub(r"[^a-z0-9-]+", "-", m.name.lower()).strip("-")
    return name or "trt-spec"


def build_config_text(m: BuildManifest, paths: dict[str, str], gpu: Optional[str]) -> str:
    """The deployment's config as the build Job reads it: output_dir on the claim (checkpoint paths as configured:
    put the checkpoints there on the claim, or edit plan.buildConfig)."""
    data = m.config.model_dump(mode="json")
    data["name"] = m.name
    data["output_dir"] = paths["buildDir"]
    if gpu:
        data["gpu"] = gpu
    return yaml.safe_dump(data, sort_keys=False)


def build_script(paths: dict[str, str]) -> str:
    cli = "python3 -m trt_spec.cli"
    return "\n".join([
        "set -euo pipefail",
        f"{cli} build {shlex.quote(paths['config'])}",
        f"{cli} repo {shlex.quote(paths['buildDir'])} --out {shlex.quote(paths['repository'])}",
    ]) + "\n"


def _block(text: str, indent: int) -> str:
    pad = " " * indent
    return "|\n" + "".join(pad + ln + "\n" if ln else "\n" for ln in text.splitlines())


def _j(v) -> str:
    return json.dumps(v)


def values_yaml(m: BuildManifest, source: Path, lay: Layout, acc: Acceptance, *, gpu: Optional[str]) -> str:
    """values.yaml with every knob documented. `plan` holds the build's facts (regenerate the chart to change them)."""
    paths = pod_paths(m)
    single_argv, spec = launch(m, paths["repository"], admin_key=False)
    image, tag = NGC_IMAGE.rsplit(":", 1)
    dev = m.runtime
    draft = f", draft on GPU(s) {dev.draft_devices}" if m.draft else ""
    startup_s = defaults.K8S_STARTUP_PERIOD_S * defaults.K8S_STARTUP_FAILURES
    return f"""\
# values.yaml of the {m.name} deployment, generated by trt-spec {__version__} (`trt-spec deploy k8s {source}`).
# Every key is a knob except `plan`, the build's own facts: regenerate the chart to change those.

# -- The pinned NGC image (trt_spec/build/trtllm.py NGC_IMAGE): Triton + TensorRT-LLM {m.tool_versions.get('tensorrt_llm') or '1.2.1'}.
image:
  repository: {image}
  tag: {_j(tag)}
  pullPolicy: IfNotPresent
  # e.g. [{{name: ngc-secret}}]: a docker-registry Secret with an NGC API key, when nodes cannot pull nvcr.io anonymously
  pullSecrets: []

# -- How trt-spec gets into the pods (the python models import it): an init container runs
# `pip install --target trtSpec.sitePackages <pipInstall>` into an emptyDir on PYTHONPATH, so the image stays
# NVIDIA's. --no-deps: click, pydantic, PyYAML, numpy<2 and tritonclient come from the image (TensorRT-LLM and
# NVIDIA's in-container clients need them; an assumption to confirm once with `pip list` in the image). Default: a
# wheelhouse you copy to the claim first:
#   pip wheel --no-deps -w wheels . && pip download --no-deps -d wheels rich markdown-it-py mdurl
#   then copy wheels/ to {paths['mountPath']}/wheels (e.g. kubectl cp into any pod that mounts the claim)
# "" = no install step: use an image with trt-spec installed (FROM the pinned image + `make gpu-setup`).
trtSpec:
  pipInstall: {_j(f"--no-deps --no-index --find-links {paths['mountPath']}/wheels trt-spec rich markdown-it-py mdurl")}
  sitePackages: /opt/trt-spec

# -- GPUs per node of the cluster: one pod per replica holds plan.ranks of them, so plan.ranks <= gpusPerNode
# (multi-node serving is refused: trt_spec/deploy/k8s.py MULTI_NODE_REFUSED).
gpusPerNode: {lay.gpus_per_node}
# -- nvidia.com/gpu.product node labels (GPU Feature Discovery) to require, e.g. [NVIDIA-H100-80GB-HBM3]; [] = any GPU node.
gpuProducts: []
# -- Node labels every pod requires (e.g. a GPU node pool).
nodeSelector: {{}}
# -- Added to the toleration of nvidia.com/gpu:NoSchedule every pod has.
tolerations: []

# -- CPU and host memory per serving pod (GPUs: plan.ranks). Host memory
# holds the engine while it loads and the memory-backed /dev/shm below counts against it.
resources:
  cpu: "16"
  memory: 128Gi

# -- /dev/shm: memory-backed emptyDir. Triton's python backend (preprocessing, postprocessing, the speculative
# BLS) passes every request's tensors through shared memory, and NCCL uses it between ranks; the container
# runtime's default (64 MiB) is too small. A limit, not a reservation.
shm:
  sizeLimit: {defaults.K8S_SHM_SIZE}

# -- The claim holding checkpoints, builds and model repositories, mounted at plan.paths.mountPath. Put the
# checkpoints where the build config names them ({m.config.target.checkpoint}{', ' + m.config.draft.checkpoint if m.config.draft and m.config.draft.checkpoint else ''}).
storage:
  existingClaim: ""     # use this PersistentVolumeClaim instead of creating one
  size: 1Ti             # FP8 70B: ~140 GB checkpoint + ~70 GB checkpoint conversion + ~70 GB engine
  storageClassName: ""  # "" = the cluster's default class
  accessModes: [ReadWriteMany]  # several replicas on several nodes read it

# -- The Job that runs `trt-spec build` then `trt-spec repo` into the claim (incremental: rerunning skips what is
# up to date). Its GPUs: FP8 calibration of the target needs its 16-bit weights in GPU memory.
build:
  enabled: true
  gpus: {min(lay.ranks, lay.gpus_per_node)}
  memory: 256Gi
  backoffLimit: 0
  activeDeadlineSeconds: 21600

# -- The serving pods.
server:
  replicas: 1  # ignored while autoscaling.enabled (the HPA owns it) for a Deployment
  # A Secret holding the admin key (one line, >= 16 characters of A-Z a-z 0-9 . _ ~ + / -) that unlocks Triton's
  # admin APIs (trt-spec serve --admin-key-file); "" = a random key nobody is told (admin APIs refused).
  adminKeySecret: ""
  adminKeySecretKey: key
  terminationGracePeriodSeconds: 60
  # GPU nodes rarely have a spare GPU for a surge pod: replace one pod at a time.
  strategy:
    type: RollingUpdate
    rollingUpdate:
      maxSurge: 0
      maxUnavailable: 1

# -- Probes on Triton's HTTP port. startup: periodSeconds x failureThreshold = {startup_s} s for the engines to be
# verified (sha256 of every byte) and loaded; a 70B FP8 engine is ~70 GB (trt-spec serve also waits that long).
probes:
  startup:
    periodSeconds: {defaults.K8S_STARTUP_PERIOD_S}
    failureThreshold: {defaults.K8S_STARTUP_FAILURES}
  readiness:
    periodSeconds: 5
    failureThreshold: 3
  liveness:
    periodSeconds: 10
    failureThreshold: 6

# -- One Service in front of the serving pods; ports map to Triton's own
# (plan.ports) by name.
service:
  type: ClusterIP
  ports:
    http: {defaults.HTTP_PORT}
    grpc: {defaults.GRPC_PORT}
    metrics: {defaults.METRICS_PORT}

# -- Non-root: NVIDIA's tritonserver images create user triton-server with uid/gid {TRITON_UID} (their build.py
# asserts `id -u triton-server` == {TRITON_UID}; not checked on this exact image: `docker run --rm IMAGE id triton-server`).
# trt-spec passes mpirun --allow-run-as-root, harmless as non-root. The claim must be writable by fsGroup.
podSecurityContext:
  runAsNonRoot: true
  runAsUser: {TRITON_UID}
  runAsGroup: {TRITON_UID}
  fsGroup: {TRITON_UID}
# -- Every container: no privilege escalation, no Linux capabilities.
securityContext:
  allowPrivilegeEscalation: false
  capabilities:
    drop: [ALL]

# -- HPA on Triton's queue-to-compute ratio (rate of nv_inference_queue_duration_us over rate of
# nv_inference_compute_infer_duration_us): 1 = requests wait as long as they compute. The custom metric
# plan.queueComputeMetric comes from prometheus-adapter with the rule in prometheus-adapter-values.yaml.
autoscaling:
  enabled: true
  minReplicas: 1
  maxReplicas: 4
  targetQueueComputeRatio: 1000m
  behavior:
    scaleDown:
      stabilizationWindowSeconds: 600  # a new replica costs minutes of engine loading: do not flap

# -- Voluntary evictions (node drains, upgrades) take at most this many serving pods at once.
podDisruptionBudget:
  enabled: true
  maxUnavailable: 1

# -- Prometheus operator objects: a PodMonitor scraping Triton's metrics port (Triton's nv_* metrics and the
# BLS's trt_spec_* speculation counters) and a PrometheusRule with the acceptance alert.
monitoring:
  # Labels the Prometheus operator selects PodMonitors and PrometheusRules by (kube-prometheus-stack: release).
  labels:
    release: prometheus
  podMonitor:
    enabled: true
    interval: 6s
  # Alert when speculative acceptance (accepted / drafted draft tokens, counters published by the speculative
  # BLS, labels model and mode) stays under break-even: a* = c + (r - 1) / k
  # (trt_spec.harness.metrics.break_even_acceptance). Here k = {acc.k} (the served default draft length),
  # r = {acc.r} (a GPU at small batch verifies k+1 tokens in about one decode step), {acc.why}.
  # Draft-free modes (n-gram, lookahead; Medusa/EAGLE heads are near free) have c = 0, so a* = 0 at r = 1: the
  # alert then never fires unless you set minAcceptance (e.g. from a measured r: trt-spec bench on the GPU).
  acceptanceAlert:
    enabled: true
    minAcceptance: {acc.threshold!r}
    window: 10m
    for: 15m
    severity: warning

# -- Object names: RELEASE-CHART unless the release name already holds the chart name; fullnameOverride wins.
nameOverride: ""
fullnameOverride: ""
# -- Labels added to every object, and environment variables added to every trt-spec container.
extraLabels: {{}}
extraEnv: []

# -- The build's facts (do not edit: regenerate with trt-spec deploy k8s).
plan:
  name: {_j(m.name)}
  configHash: {_j(m.config_hash)}
  # GPUs: target TP{m.target.tp} x PP{m.target.pp} on GPU(s) {dev.target_devices}{draft}
  ranks: {lay.ranks}
  singleProcess: {_j(lay.single_process)}
  speculativeMode: {_j(m.speculative.mode)}
  numDraftTokens: {acc.k}
  queueComputeMetric: {_j(defaults.QUEUE_COMPUTE_METRIC)}
  adminKeyFile: {ADMIN_KEY_FILE}
  ports:
    http: {defaults.HTTP_PORT}
    grpc: {defaults.GRPC_PORT}
    metrics: {defaults.METRICS_PORT}
  paths:
    mountPath: {paths['mountPath']}
    buildDir: {_j(paths['buildDir'])}
    repository: {_j(paths['repository'])}
    config: {_j(paths['config'])}
  # Environment of trt-spec's launch (orchestrator mode for a draft with a multi-GPU target).
  env: {_j(spec.env) if spec.env else '{}'}
  # A single pod runs `trt-spec serve`, which runs (trt-spec serve --dry-run):
  #   {shlex.join(single_argv).replace(spec.admin_key, spec.admin_key_shown)}
  buildScript: {_block(build_script(paths), 4)}  buildConfig: {_block(build_config_text(m, paths, gpu), 4)}"""


def adapter_values_yaml() -> str:
    """prometheus-adapter values (rules.custom) that define the HPA's metric from Triton's own counters."""
    name = defaults.QUEUE_COMPUTE_METRIC
    query = ("sum by (<<.GroupBy>>) (rate(nv_inference_queue_duration_us{<<.LabelMatchers>>}[1m])) / "
             "clamp_min(sum by (<<.GroupBy>>) (rate(nv_inference_compute_infer_duration_us{<<.LabelMatchers>>}[1m])), 1)")
    return f"""\
# prometheus-adapter values: the custom metric {name} the chart's HPA scales on.
#   helm upgrade --install -n monitoring prometheus-adapter prometheus-community/prometheus-adapter \\
#     --set prometheus.url=http://prometheus-kube-prometheus-prometheus -f {ADAPTER_VALUES}
# Check: kubectl get --raw "/apis/custom.metrics.k8s.io/v1beta1/namespaces/NAMESPACE/pods/*/{name}"
# The ratio is NVIDIA's (their recording rule triton:queue_compute:ratio): time requests spent queued over time
# they spent computing, per pod, over 1 minute.
metricsRelistInterval: 6s
rules:
  default: false
  custom:
    - seriesQuery: 'nv_inference_queue_duration_us{{namespace!="",pod!=""}}'
      resources:
        overrides:
          namespace: {{resource: namespace}}
          pod: {{resource: pod}}
      name:
        matches: "^nv_inference_queue_duration_us$"
        as: {_j(name)}
      metricsQuery: {_j(query)}
"""


def chart_yaml(m: BuildManifest) -> str:
    tag = NGC_IMAGE.rsplit(":", 1)[1]
    return f"""\
apiVersion: v2
name: {chart_name(m)}
description: {_j(f"trt-spec speculative decoding deployment {m.name} ({m.speculative.mode}) on Triton + TensorRT-LLM")}
type: application
version: {__version__}
appVersion: {_j(tag)}
kubeVersion: ">=1.27.0-0"
"""


def write_chart(source: Path, out: Path, *, gpus_per_node: Optional[int] = None,
                min_acceptance: Optional[float] = None, sets: Iterable[str] = (), gpu: Optional[str] = None) -> Path:
    """Write the chart to `out` atomically (temp dir, then rename; safe to rerun over an earlier chart). Every check
    runs before anything is written. Returns `out`."""
    m = load_manifest(source, sets, gpu)
    lay = layout(m, gpus_per_node)
    if min_acceptance is not None and not 0.0 <= min_acceptance <= 1.0:
        raise DeployError(f"--min-acceptance must be in [0, 1], got {min_acceptance}")
    acc = acceptance(m, min_acceptance)
    files = {"Chart.yaml": chart_yaml(m), "values.yaml": values_yaml(m, Path(source), lay, acc, gpu=gpu),
             ADAPTER_VALUES: adapter_values_yaml()}
    out = Path(out)
    if out.exists() and not (out / "Chart.yaml").is_file():
        if not out.is_dir() or any(out.iterdir()):
            raise DeployError(f"{out}: exists and is not a chart trt-spec wrote; pass an empty or new --out directory")
    with replacing_dir(out) as tmp:
        shutil.copytree(CHART_SOURCES, tmp, ignore=shutil.ignore_patterns("__pycache__"))
        for name, text in files.items():
            (tmp / name).write_text(text)
    return out
