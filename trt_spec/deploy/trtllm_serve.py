"""`trt-spec deploy trtllm-serve`: a `runtime: llmapi` build (or a config's plan) -> a bundle serving it with
TensorRT-LLM's own OpenAI server: extra_llm_api_options.yaml (model.yaml's LLM arguments), launch.sh and a README.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Iterable, Optional

import yaml

from .. import __version__
from ..builder.model_info import is_imported
from ..builder.trtllm import NGC_IMAGE, TRTLLM_VERSION
from ..records import llmapi_contract as lc
from ..records.manifest import BuildManifest
from .llm_api import NodeLayout, check_port, checkpoint, engine_args, load, node_layout, write_files

WHAT = "trtllm-serve"
OPTIONS_FILE = "extra_llm_api_options.yaml"
LAUNCH_FILE = "launch.sh"
README_FILE = "README.md"
BUNDLE_FILES = (OPTIONS_FILE, LAUNCH_FILE, README_FILE)
SERVE = "trtllm-serve"
OPTIONS_PATH = f"$HERE/{OPTIONS_FILE}"  # launch.sh sets HERE to its own directory
LAUNCHERS = ("srun", "mpirun")  # srun is the default (upstream-facts: trtllm-serve-multinode-srun)

# trtllm-serve flag -> the same value's path in engine_args, so flags and YAML agree whichever wins
FLAG_KEYS: dict[str, tuple[str, ...]] = {
    "--backend": ("backend",),
    "--tp_size": ("tensor_parallel_size",),
    "--pp_size": ("pipeline_parallel_size",),
    "--max_batch_size": ("max_batch_size",),
    "--max_num_tokens": ("max_num_tokens",),
    "--max_seq_len": ("max_seq_len",),
    "--kv_cache_free_gpu_memory_fraction": ("kv_cache_config", "free_gpu_memory_fraction"),
}


def _value(args: dict, path: tuple[str, ...]):
    v = args
    for k in path:
        v = v[k]
    return v


def serve_argv(m: BuildManifest, args: dict, *, host: str, port: int) -> list[str]:
    """trtllm-serve's argv: MODEL, the flags (values from `args`) and the options file."""
    argv = [SERVE, checkpoint(m), "--backend", str(args["backend"]), "--host", host, "--port", str(port)]
    for flag, path in FLAG_KEYS.items():
        if flag != "--backend":
            argv += [flag, str(_value(args, path))]
    return argv + ["--extra_llm_api_options", OPTIONS_PATH]


def launcher_argv(lay: NodeLayout, launcher: str) -> list[str]:
    """The multi-node prefix: every rank runs trtllm-llmapi-launch, rank 0 the server."""
    if launcher == "srun":
        head = ["srun", "-N", str(lay.nodes), "--ntasks", str(lay.ranks)]
        head += ["--ntasks-per-node", str(lay.gpus_per_node), "--mpi=pmix"]
    else:  # OpenMPI: HOSTS=node0:G,node1:G
        head = ["mpirun", "-np", str(lay.ranks), "-H", "$HOSTS"]
    return head + [lc.TRTLLM_LLMAPI_LAUNCH]


def _q(a: str) -> str:
    return f'"{a}"' if a.startswith("$") else shlex.quote(a)  # $HERE / $HOSTS stay expandable


def _shell(prefix: list[str], serve: list[str], indent: str) -> str:
    """One command over several lines: launcher, trtllm-serve and MODEL, then one flag and value per line."""
    lines = [" ".join(_q(a) for a in prefix + serve[:2])]
    lines += [f"{_q(serve[i])} {_q(serve[i + 1])}" for i in range(2, len(serve), 2)]
    return f" \\\n{indent}  ".join(lines)


def launch_sh(m: BuildManifest, source: Path, lay: NodeLayout, serve: list[str]) -> str:
    where = f" on {lay.nodes} nodes of {lay.gpus_per_node}" if lay.nodes > 1 else ""
    head = (
        "#!/usr/bin/env bash\n"
        f"# trtllm-serve for {m.name}: written by trt-spec {__version__} deploy trtllm-serve from {source}\n"
        f"# (config {m.config_hash[:12]}); regenerate rather than edit. {m.speculation.mode} speculation inside "
        f"TensorRT-LLM {TRTLLM_VERSION}'s\n# LLM API, TP{m.target.tp} x PP{m.target.pp} = {lay.ranks} GPU(s){where}; "
        f"the LLM's arguments: {OPTIONS_FILE}.\n"
        "set -euo pipefail\n"
        'HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"\n'
    )
    if lay.nodes == 1:
        return head + "exec " + _shell([], serve, "") + "\n"
    cases = "".join(
        f"  {name})\n    exec {_shell(launcher_argv(lay, name), serve, '    ')}\n    ;;\n" for name in LAUNCHERS
    )
    hosts = f"node0:{lay.gpus_per_node},node1:{lay.gpus_per_node},..."
    return (
        head
        + "# Every node: the image, the checkpoints and this directory at the same paths. LAUNCHER=srun (inside a\n"
        f"# Slurm allocation of {lay.nodes} nodes) or LAUNCHER=mpirun with HOSTS={hosts}\n"
        'LAUNCHER="${LAUNCHER:-srun}"\n'
        f'if [ "$LAUNCHER" = mpirun ]; then : "${{HOSTS:?set HOSTS={hosts} for mpirun}}"; fi\n'
        'case "$LAUNCHER" in\n'
        f"{cases}"
        '  *) echo "LAUNCHER must be srun or mpirun, got $LAUNCHER" >&2; exit 2 ;;\n'
        "esac\n"
    )


def _run_it(lay: NodeLayout, port: int, dirs: list[str]) -> str:
    """README instructions to start launch.sh: docker on one node, srun or mpirun past one."""
    if lay.nodes == 1:
        mounts = " ".join(f"-v {shlex.quote(d)}:{shlex.quote(d)}:ro" for d in dirs)
        return f"""```bash
docker run --rm --gpus all --ipc host -p {port}:{port} -v "$PWD:/deploy:ro" \\
  {mounts} \\
  {NGC_IMAGE} bash /deploy/{LAUNCH_FILE}
```
"""
    per = lay.gpus_per_node
    return f"""{lay.ranks} ranks on {lay.nodes} nodes of {per} GPUs: `{LAUNCH_FILE}` runs every rank under
`{lc.TRTLLM_LLMAPI_LAUNCH}` (the server on rank 0, workers on the others), inside the image on every node, with the
checkpoints and this directory at the same paths on all of them:

```bash
bash {LAUNCH_FILE}                                       # in a Slurm allocation of {lay.nodes} nodes (srun, --mpi=pmix)
LAUNCHER=mpirun HOSTS=node0:{per},node1:{per} bash {LAUNCH_FILE}   # OpenMPI
```
"""


def readme(m: BuildManifest, source: Path, lay: NodeLayout, args: dict, *, port: int) -> str:
    model = Path(checkpoint(m)).name  # trtllm-serve serves a local MODEL under its directory name
    cfg = m.config
    before = ""
    if is_imported(cfg.target.checkpoint) or (cfg.draft is not None and cfg.draft.distill is not None):
        before = (
            f"\nFirst, on this host: `trt-spec build {source}` writes the checkpoints this serves (the GGUF\n"
            "import and the distilled draft) at the paths below.\n"
        )
    spec = args.get("speculative_config") or {}
    dirs = [d for d in (checkpoint(m), spec.get(lc.SPEC_MODEL_DIR)) if d]
    ckpts = ", ".join(f"`{d}`" for d in dirs)
    where = f"{lay.nodes} nodes of {lay.gpus_per_node} GPUs" if lay.nodes > 1 else f"{lay.ranks} GPU(s), one node"
    kv = args["kv_cache_config"]
    body = json.dumps({"model": model, "prompt": "The capital of France is", "max_tokens": 32})
    return f"""# trtllm-serve: {m.name}

Written by `trt-spec deploy trtllm-serve {source}` (trt-spec {__version__}); regenerate rather than
edit. TensorRT-LLM {TRTLLM_VERSION}'s OpenAI server over its LLM API: {m.speculation.mode} speculation inside the
model (`speculative_config`), TP{m.target.tp} x PP{m.target.pp} on {where}.
{before}
- `{OPTIONS_FILE}`: the LLM's arguments, those of the Triton LLM-API model's `model.yaml` for
  this config (`trt-spec repo`) less `model` (trtllm-serve's MODEL argument) and `triton_config`.
- `{LAUNCH_FILE}`: the command. Its flags repeat the YAML's numbers: KV cache {kv["free_gpu_memory_fraction"]} of the
  free GPU memory, batches of up to {args["max_batch_size"]} requests and {args["max_num_tokens"]} tokens, sequences
  of up to {args["max_seq_len"]} tokens.

Image: `{NGC_IMAGE}` (TensorRT-LLM {TRTLLM_VERSION}, with `trtllm-serve` and
`{lc.TRTLLM_LLMAPI_LAUNCH}`). Checkpoints: {ckpts}.

{_run_it(lay, port, dirs)}
Try it once `curl -s localhost:{port}/health` answers:

```bash
curl -s localhost:{port}/v1/completions -H 'Content-Type: application/json' \\
  -d {shlex.quote(body)}
```

The model name is the checkpoint directory's name (trtllm-serve serves a local MODEL under it). To measure the
speedup, serve the same target without `speculative_config` on another port and run
`trt-spec bench openai --url http://HOST:BASELINE_PORT --url http://HOST:{port} --model {model} --model {model}`.
"""


def write_bundle(
    source: Path,
    out: Path,
    *,
    gpus_per_node: Optional[int] = None,
    port: int = lc.TRTLLM_SERVE_PORT,
    sets: Iterable[str] = (),
    gpu: Optional[str] = None,
) -> Path:
    """Write the bundle to `out` atomically, after every check.

    Raises LlmApiArgsError, or ConfigError/PreflightError/HardwareError."""
    m = load(source, sets, gpu, what=WHAT)
    lay = node_layout(m, gpus_per_node)
    check_port(port)
    args = engine_args(m)
    serve = serve_argv(m, args, host=lc.TRTLLM_SERVE_HOST, port=port)
    files = {
        OPTIONS_FILE: f"# The LLM's arguments for {m.name} (trt-spec deploy trtllm-serve; model.yaml's, one source)\n"
        + yaml.safe_dump(args, sort_keys=False),
        LAUNCH_FILE: launch_sh(m, Path(source), lay, serve),
        README_FILE: readme(m, Path(source), lay, args, port=port),
    }
    return write_files(Path(out), files, LAUNCH_FILE)
