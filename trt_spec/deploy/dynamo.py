"""`trt-spec deploy dynamo`: a `runtime: llmapi` build (or a config's plan) -> an NVIDIA Dynamo bundle.

Writes extra-engine-args.yaml (model.yaml's LLM arguments; upstream-facts: dynamo-worker-flags), launch.sh (frontend
and worker: file discovery on one node, srun + etcd past one;
upstream-facts: dynamo-runtime-discovery, dynamo-multinode-slurm), a DynamoGraphDeployment when the checkpoints are on
the claim (upstream-facts: dynamo-dgd-model), and a README.
"""

from __future__ import annotations

import posixpath
import shlex
from pathlib import Path
from typing import Iterable, Optional

import yaml

from .. import __version__
from ..records import defaults
from ..records import llmapi_contract as lc
from ..records.manifest import BuildManifest
from .k8s import chart_name
from .llm_api import check_port, checkpoint, draft_dir, engine_args, load, node_layout, write_files

WHAT = "Dynamo"
DYNAMO_VERSION = "1.6.1"  # ai-dynamo on PyPI
# (upstream-facts: dynamo-trtllm-image)
DYNAMO_IMAGE = f"nvcr.io/nvidia/ai-dynamo/tensorrtllm-runtime:{DYNAMO_VERSION}"
DYNAMO_TRTLLM_VERSION = "1.3.0rc29"
DGD_API_VERSION = "nvidia.com/v1beta1"
DGD_KIND = "DynamoGraphDeployment"
FRONTEND_PORT = 8000  # dynamo.frontend's --http-port default (upstream-facts: dynamo-frontend-flags)
ENGINE_ARGS_FILE = "extra-engine-args.yaml"
LAUNCH_FILE = "launch.sh"
DGD_FILE = "dynamo-graph-deployment.yaml"
README_FILE = "README.md"
ENGINE_ARGS_DIR = "/etc/trt-spec"  # the worker's ConfigMap mount
MODELS_CLAIM = "models"  # the checkpoints' PersistentVolumeClaim, named as in Dynamo's multinode example
FRONTEND_CMD = ["python3", "-m", "dynamo.frontend"]
WORKER_CMD = ["python3", "-m", "dynamo.trtllm"]


def worker_args(m: BuildManifest, args: dict, engine_args_path: str, discovery: Optional[str]) -> list[str]:
    """dynamo.trtllm's flags; discovery None leaves it to the environment (the operator sets it).

    TP and PP repeat the file's numbers (upstream-facts: dynamo-worker-flags)."""
    argv = [
        "--model",
        checkpoint(m),
        "--served-model-name",
        m.name,
        "--extra-engine-args",
        engine_args_path,
        "--tensor-parallel-size",
        str(args["tensor_parallel_size"]),
        "--pipeline-parallel-size",
        str(args["pipeline_parallel_size"]),
    ]
    return argv + (["--discovery-backend", discovery] if discovery else [])


def frontend_args(port: int, discovery: Optional[str]) -> list[str]:
    return ["--http-port", str(port)] + (["--discovery-backend", discovery] if discovery else [])


def _q(a: str) -> str:
    return f'"{a}"' if a.startswith("$") else shlex.quote(a)


def _lines(argv: list[str], head: int, indent: str = "") -> str:
    """A command over several lines: the first `head` words, then one flag and value per line."""
    out = [" ".join(_q(a) for a in argv[:head])]
    out += [f"{_q(argv[i])} {_q(argv[i + 1])}" for i in range(head, len(argv), 2)]
    return f" \\\n{indent}  ".join(out)


def launch_sh(m: BuildManifest, source: Path, args: dict, ranks: int, nodes: int, per: int, port: int) -> str:
    where = f"{nodes} nodes of {per} GPUs" if nodes > 1 else f"{ranks} GPU(s) on this host"
    head = (
        "#!/usr/bin/env bash\n"
        f"# Dynamo {DYNAMO_VERSION} for {m.name}: written by trt-spec {__version__} deploy dynamo from {source}\n"
        f"# (config {m.config_hash[:12]}); regenerate rather than edit. {m.speculation.mode} speculation inside "
        f"TensorRT-LLM's LLM API,\n# TP{m.target.tp} x PP{m.target.pp} on {where}; the LLM's arguments: "
        f"{ENGINE_ARGS_FILE}.\n# Run inside {DYNAMO_IMAGE}.\n"
        "set -euo pipefail\n"
        'HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"\n'
    )
    if nodes == 1:
        worker = WORKER_CMD + worker_args(m, args, f"$HERE/{ENGINE_ARGS_FILE}", "file")
        return head + (
            "# Discovery through a directory (--discovery-backend file), requests over TCP, events over ZMQ: no etcd,\n"
            "# no NATS on one host.\n"
            'export DYN_FILE_KV="${DYN_FILE_KV:-$(mktemp -d)}"\n'
            f"{_lines(FRONTEND_CMD + frontend_args(port, 'file'), 3)} &\n"
            "FRONTEND=$!\n"
            "trap 'kill \"$FRONTEND\" 2>/dev/null || true' EXIT\n"
            f"{_lines(worker, 3)}\n"
        )
    worker = WORKER_CMD + worker_args(m, args, f"$HERE/{ENGINE_ARGS_FILE}", "etcd")
    srun = ["srun", "-N", str(nodes), "--ntasks", str(ranks), "--ntasks-per-node", str(per), "--mpi=pmix"]
    return head + (
        f"# One worker over {nodes} nodes is one MPI world: every rank runs {lc.TRTLLM_LLMAPI_LAUNCH}, rank 0 the\n"
        "# Dynamo worker. Inside a Slurm allocation of those nodes, with the image, the checkpoints and this\n"
        "# directory at the same paths on all of them, and an etcd every node reaches (discovery across hosts).\n"
        ': "${ETCD_ENDPOINTS:?set ETCD_ENDPOINTS=HOST:2379, an etcd every node reaches}"\n'
        f"{_lines(FRONTEND_CMD + frontend_args(port, 'etcd'), 3)} &\n"
        "FRONTEND=$!\n"
        "trap 'kill \"$FRONTEND\" 2>/dev/null || true' EXIT\n"
        f"{_lines(srun + [lc.TRTLLM_LLMAPI_LAUNCH] + worker, len(srun) + 4)}\n"
    )


def model_dirs(m: BuildManifest, args: dict) -> list[str]:
    return [d for d in (checkpoint(m), draft_dir(args, DYNAMO_TRTLLM_VERSION)) if d]


def on_claim(dirs: list[str]) -> bool:
    """Whether every checkpoint is under the claim's mount path."""
    mount = defaults.K8S_MOUNT_PATH.rstrip("/") + "/"
    return all(posixpath.normpath(d).startswith(mount) for d in dirs)


def _container(args: list[str], command: list[str]) -> dict:
    return {"name": "main", "image": DYNAMO_IMAGE, "command": command, "args": args}


def dgd(m: BuildManifest, args: dict, nodes: int, per: int, port: int) -> list[dict]:
    """The engine-args ConfigMap and the DynamoGraphDeployment (Frontend + TRTLLMWorker)."""
    name = chart_name(m)
    cm = f"{name}-engine-args"
    worker = _container(worker_args(m, args, f"{ENGINE_ARGS_DIR}/{ENGINE_ARGS_FILE}", None), WORKER_CMD)
    worker["resources"] = {"limits": {"nvidia.com/gpu": str(per)}}
    worker["volumeMounts"] = [
        {"name": "models", "mountPath": defaults.K8S_MOUNT_PATH, "readOnly": True},
        {"name": "engine-args", "mountPath": ENGINE_ARGS_DIR, "readOnly": True},
    ]
    volumes = [
        {"name": "models", "persistentVolumeClaim": {"claimName": MODELS_CLAIM}},
        {"name": "engine-args", "configMap": {"name": cm}},
    ]
    worker_component = {"name": "TRTLLMWorker", "type": "worker", "replicas": 1}
    if nodes > 1:
        worker_component["multinode"] = {"nodeCount": nodes}
    worker_component["podTemplate"] = {"spec": {"containers": [worker], "volumes": volumes}}
    frontend = {
        "name": "Frontend",
        "type": "frontend",
        "replicas": 1,
        "podTemplate": {"spec": {"containers": [_container(frontend_args(port, None), FRONTEND_CMD)]}},
    }
    spec: dict = {"backendFramework": "trtllm", "components": [frontend, worker_component]}
    if nodes > 1:  # the image runs as root (upstream-facts: dynamo-multinode-root-env)
        spec["env"] = [
            {"name": "OMPI_ALLOW_RUN_AS_ROOT", "value": "1"},
            {"name": "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "value": "1"},
        ]
    configmap = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": cm},
        "data": {ENGINE_ARGS_FILE: yaml.safe_dump(args, sort_keys=False)},
    }
    graph = {"apiVersion": DGD_API_VERSION, "kind": DGD_KIND, "metadata": {"name": name}, "spec": spec}
    return [configmap, graph]


class _Dumper(yaml.SafeDumper):
    """Multi-line strings as literal blocks."""


_Dumper.add_representer(
    str, lambda d, v: d.represent_scalar("tag:yaml.org,2002:str", v, style="|" if "\n" in v else None)
)


def dgd_yaml(m: BuildManifest, objs: list[dict], nodes: int, per: int) -> str:
    where = f"{nodes} nodes x {per} GPUs (multinode.nodeCount)" if nodes > 1 else f"{per} GPU(s), one node"
    head = (
        f"# Dynamo {DYNAMO_VERSION} on Kubernetes for {m.name} (trt-spec {__version__} deploy dynamo; regenerate "
        "rather than edit).\n"
        f"# Needs Dynamo's operator (its platform Helm chart, {DYNAMO_VERSION}) and a PersistentVolumeClaim "
        f"{MODELS_CLAIM!r} holding the\n# checkpoints at their paths under {defaults.K8S_MOUNT_PATH}. Worker: "
        f"{where}.\n# kubectl apply -n NAMESPACE -f {DGD_FILE}\n"
    )
    return head + yaml.dump_all(objs, Dumper=_Dumper, sort_keys=False, width=120)


def readme(m: BuildManifest, source: Path, args: dict, ranks: int, nodes: int, per: int, port: int) -> str:
    dirs = model_dirs(m, args)
    kube = (
        f"- `{DGD_FILE}`: a ConfigMap with the engine args and a `{DGD_KIND}` ({DGD_API_VERSION}) for Dynamo's\n"
        f"  operator: a Frontend and a TRTLLMWorker on `{DYNAMO_IMAGE}`, the checkpoints from the claim\n"
        f"  `{MODELS_CLAIM}` mounted at `{defaults.K8S_MOUNT_PATH}`"
        + (f", the worker on {nodes} nodes of {per} GPUs (`multinode.nodeCount: {nodes}`).\n" if nodes > 1 else ".\n")
        if on_claim(dirs)
        else f"- No `{DGD_FILE}`: the checkpoints ({', '.join(dirs)}) are not under `{defaults.K8S_MOUNT_PATH}`, the\n"
        "  claim's mount path; a cluster deployment needs them there (use a config whose checkpoint paths are).\n"
    )
    where = f"{nodes} nodes of {per} GPUs" if nodes > 1 else f"{ranks} GPU(s), one host"
    run = (
        f"On one host, inside the image (checkpoints mounted at their paths):\n\n```bash\nbash {LAUNCH_FILE}\n```\n"
        if nodes == 1
        else f"Inside a Slurm allocation of {nodes} nodes, in the image on each, with etcd reachable:\n\n"
        f"```bash\nETCD_ENDPOINTS=HEAD:2379 bash {LAUNCH_FILE}\n```\n"
    )
    return f"""# Dynamo: {m.name}

Written by `trt-spec deploy dynamo {source}` (trt-spec {__version__}); regenerate rather than edit. NVIDIA Dynamo
{DYNAMO_VERSION}'s TensorRT-LLM worker ({m.speculation.mode} speculation inside the LLM API, TP{m.target.tp} x
PP{m.target.pp} on {where}) behind Dynamo's OpenAI frontend on port {port}.

- `{ENGINE_ARGS_FILE}`: the LLM's arguments, those of the Triton LLM-API model's `model.yaml` for this
  config less `model` (the worker's `--model`) and `triton_config`; `--extra-engine-args` merges it over the
  worker's defaults, so its numbers are the plan's.
- `{LAUNCH_FILE}`: the frontend and the worker.
{kube}
Image: `{DYNAMO_IMAGE}` (TensorRT-LLM {DYNAMO_TRTLLM_VERSION}). The LLM arguments are the 1.2 line's (its Triton
image runs 1.2.1) with `speculative_config` under the 1.3 line's names (decoding_type `Draft_Target`/`Eagle3`/`NGram`/
`MTP`, the draft as `speculative_model`), read from a stored 1.3-line llm_args.py, not {DYNAMO_TRTLLM_VERSION}'s own.
Checkpoints: {", ".join(f"`{d}`" for d in dirs)}.

{run}
Then `curl -s localhost:{port}/v1/models` lists `{m.name}` once the worker has loaded.
"""


def write_bundle(
    source: Path,
    out: Path,
    *,
    gpus_per_node: Optional[int] = None,
    port: int = FRONTEND_PORT,
    sets: Iterable[str] = (),
    gpu: Optional[str] = None,
) -> Path:
    """Write the bundle to `out` atomically, after every check.

    Raises LlmApiArgsError, or ConfigError/PreflightError/HardwareError."""
    m = load(source, sets, gpu, what=WHAT)
    lay = node_layout(m, gpus_per_node)
    ranks, nodes, per = lay.ranks, lay.nodes, lay.gpus_per_node
    check_port(port)
    args = engine_args(m, DYNAMO_TRTLLM_VERSION)
    files = {
        ENGINE_ARGS_FILE: f"# The LLM's arguments for {m.name} (trt-spec deploy dynamo; model.yaml's, one source)\n"
        + yaml.safe_dump(args, sort_keys=False),
        LAUNCH_FILE: launch_sh(m, Path(source), args, ranks, nodes, per, port),
        README_FILE: readme(m, Path(source), args, ranks, nodes, per, port),
    }
    if on_claim(model_dirs(m, args)):
        files[DGD_FILE] = dgd_yaml(m, dgd(m, args, nodes, per, port), nodes, per)
    return write_files(Path(out), files, LAUNCH_FILE)
