"""trt-spec deploy dynamo: goldens for every shipped `runtime: llmapi` config, the engine args equal to model.yaml's
LLM arguments, every DynamoGraphDeployment validated against the vendored v1beta1 schema (tests/data/crds, source
inside) and its pod templates against Kubernetes' own (kubernetes-validate), the two-node layout, the launch lines,
refusals. With TRT_SPEC_DYNAMO_PYTHON naming a Python that has ai-dynamo 1.6.1 (not a trt-spec dependency: its
`aisimulate` dependency installs only from pypi.nvidia.com), the launch line's frontend runs and answers."""

from __future__ import annotations

import json
import os
import shlex
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml
from click.testing import CliRunner

from trt_spec.builder.pipeline import manifest_from
from trt_spec.cli import main
from trt_spec.deploy import dynamo as dy
from trt_spec.deploy.llm_api import LlmApiArgsError
from trt_spec.records import llmapi_contract as lc
from trt_spec.repository.llmapi import model_yaml

from ..conftest import REPO
from .test_k8s import K8S_VERSION, STRICT_CRDS

CONFIGS = REPO / "build_configs"
GOLDEN = REPO / "tests" / "golden" / "deploy" / "dynamo"
UPDATE = os.environ.get("TRT_SPEC_UPDATE_GOLDENS") == "1"
LLMAPI = sorted(p.stem for p in CONFIGS.glob("*.yaml") if "runtime: llmapi" in p.read_text())
TWO_NODE = "deepseek-v3-mtp-h100-2node"
DGD_KEY = (dy.DGD_API_VERSION, dy.DGD_KIND)


def _norm(text: str) -> str:
    return text.replace(str(REPO), "<REPO>").replace(str(Path.cwd().resolve()), "<CWD>")


@pytest.fixture(scope="module")
def bundles(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("dynamo")
    return {name: dy.write_bundle(CONFIGS / f"{name}.yaml", root / name) for name in LLMAPI}


def _objs(bundle: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all((bundle / dy.DGD_FILE).read_text()) if d]


def _dgd(bundle: Path) -> dict:
    return next(o for o in _objs(bundle) if o["kind"] == dy.DGD_KIND)


def _component(dgd: dict, name: str) -> dict:
    return next(c for c in dgd["spec"]["components"] if c["name"] == name)


def validate(obj: dict) -> None:
    """A DGD against the vendored schema (closed objects: a misspelt field fails) and each pod template against
    core/v1 PodTemplateSpec; anything else against Kubernetes' schema."""
    if (obj["apiVersion"], obj["kind"]) != DGD_KEY:
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
        return
    jsonschema.validate(obj, STRICT_CRDS[DGD_KEY], cls=jsonschema.Draft7Validator)
    for c in obj["spec"]["components"]:
        pt = {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": c["name"].lower()}}
        kubernetes_validate.validate(dict(pt, template=c["podTemplate"]), K8S_VERSION, strict=True)


def test_the_llmapi_configs_include_the_two_node_one():
    assert TWO_NODE in LLMAPI and "deepseek-v3-mtp-h200" in LLMAPI


@pytest.mark.parametrize("name", LLMAPI)
def test_golden(bundles, name):
    got = {p.name: _norm(p.read_text()) for p in sorted(bundles[name].iterdir())}
    golden = GOLDEN / name
    if UPDATE:
        golden.mkdir(parents=True, exist_ok=True)
        for f in golden.iterdir():
            f.unlink()
        for fname, text in got.items():
            (golden / fname).write_text(text)
    assert golden.is_dir(), f"missing golden {golden}; run TRT_SPEC_UPDATE_GOLDENS=1 pytest tests/deploy/test_dynamo.py"
    assert {p.name: p.read_text() for p in sorted(golden.iterdir())} == got


@pytest.mark.parametrize("name", LLMAPI)
def test_engine_args_are_model_yamls_llm_arguments(bundles, name):
    m = manifest_from(CONFIGS / f"{name}.yaml")
    y = model_yaml(m, speculative=True, decoupled=True)
    args = yaml.safe_load((bundles[name] / dy.ENGINE_ARGS_FILE).read_text())
    assert set(args) == set(y) - {lc.TRITON_KEY, "model"}
    assert set(args) <= set(lc.LLM_KEYS)
    assert all(args[k] == y[k] for k in args if k != "speculative_config")
    # the speculative_config is model.yaml's under TensorRT-LLM 1.3's names: Dynamo 1.6.1 runs 1.3.0rc29
    assert args["speculative_config"] == lc.speculative_config_for(y["speculative_config"], dy.DYNAMO_TRTLLM_VERSION)
    if (bundles[name] / dy.DGD_FILE).is_file():  # the ConfigMap holds the same file
        cm = next(o for o in _objs(bundles[name]) if o["kind"] == "ConfigMap")
        assert yaml.safe_load(cm["data"][dy.ENGINE_ARGS_FILE]) == args


@pytest.mark.parametrize("name", LLMAPI)
def test_every_object_validates(bundles, name):
    if not (bundles[name] / dy.DGD_FILE).is_file():
        pytest.skip("checkpoints outside the claim: no DGD (test_first_contact_has_no_dgd)")
    objs = _objs(bundles[name])
    assert sorted(o["kind"] for o in objs) == ["ConfigMap", dy.DGD_KIND]
    for obj in objs:
        validate(obj)


def test_validation_can_fail(bundles):
    good = _dgd(bundles[TWO_NODE])
    for path, value in (
        (("spec", "components", 1, "multinode", "nodeCount"), 1),  # MultinodeSpec: nodeCount >= 2
        (("spec", "components", 1, "type"), "leader"),  # ComponentType enum
        (("spec", "backendFramework"), "tensorrt"),
        (("spec", "components", 1, "multinode", "nodes"), 2),  # a misspelt field
        (("spec", "components", 1, "podTemplate", "spec", "containers", 0, "resource"), {}),  # core/v1
    ):
        bad = json.loads(json.dumps(good))
        obj = bad
        for k in path[:-1]:
            obj = obj[k]
        obj[path[-1]] = value
        with pytest.raises((jsonschema.ValidationError, kubernetes_validate.ValidationError)):
            validate(bad)


def test_two_node_layout(bundles):
    dgd = _dgd(bundles[TWO_NODE])
    worker = _component(dgd, "TRTLLMWorker")
    assert worker["multinode"] == {"nodeCount": 2}
    main_c = worker["podTemplate"]["spec"]["containers"][0]
    assert main_c["resources"]["limits"]["nvidia.com/gpu"] == "8"  # per node: 2 x 8 = TP16
    assert main_c["image"] == dy.DYNAMO_IMAGE and main_c["command"] == dy.WORKER_CMD
    args = main_c["args"]
    assert args[args.index("--tensor-parallel-size") + 1] == "16"
    assert args[args.index("--extra-engine-args") + 1] == f"{dy.ENGINE_ARGS_DIR}/{dy.ENGINE_ARGS_FILE}"
    assert {e["name"] for e in dgd["spec"]["env"]} == {"OMPI_ALLOW_RUN_AS_ROOT", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"}
    launch = (bundles[TWO_NODE] / dy.LAUNCH_FILE).read_text().replace("\\\n", " ")
    line = next(ln for ln in launch.splitlines() if ln.startswith("srun "))
    argv = shlex.split(line)
    assert argv[:9] == [
        "srun",
        "-N",
        "2",
        "--ntasks",
        "16",
        "--ntasks-per-node",
        "8",
        "--mpi=pmix",
        "trtllm-llmapi-launch",
    ]
    assert argv[9:12] == dy.WORKER_CMD and "ETCD_ENDPOINTS" in launch


@pytest.mark.parametrize("name", ["deepseek-v3-mtp-h200", "llama33-70b-eagle3-h100-tp2"])
def test_one_node_layout(bundles, name):
    m = manifest_from(CONFIGS / f"{name}.yaml")
    worker = _component(_dgd(bundles[name]), "TRTLLMWorker")
    assert "multinode" not in worker
    assert worker["podTemplate"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == str(m.target.tp)
    launch = (bundles[name] / dy.LAUNCH_FILE).read_text()
    assert "srun" not in launch and "--discovery-backend file" in launch and "DYN_FILE_KV" in launch


def test_gpus_per_node_decides_the_nodes(tmp_path):
    out = dy.write_bundle(CONFIGS / "deepseek-v3-mtp-h200.yaml", tmp_path / "b", gpus_per_node=4)
    assert _component(_dgd(out), "TRTLLMWorker")["multinode"] == {"nodeCount": 2}
    out = dy.write_bundle(CONFIGS / f"{TWO_NODE}.yaml", tmp_path / "c", gpus_per_node=16)
    assert "multinode" not in _component(_dgd(out), "TRTLLMWorker")


def test_first_contact_has_no_dgd(bundles):
    b = bundles["smollm2-first-contact-llmapi"]
    assert not (b / dy.DGD_FILE).exists() and (b / dy.LAUNCH_FILE).is_file()
    assert f"No `{dy.DGD_FILE}`" in (b / dy.README_FILE).read_text()


@pytest.mark.parametrize(
    "config,kw,match",
    [
        ("llama33-70b-fp8-h200", {}, r"runtime 'engine' .* Dynamo serves TensorRT-LLM's LLM API only"),
        ("cpu-smollm2-draft", {"sets": ["runtime=llmapi"]}, r"CPU reference deployment.* Dynamo runs TensorRT-LLM"),
        ("deepseek-v3-mtp-h200", {"gpus_per_node": 3}, r"do not split evenly over 3 nodes of 3 GPUs"),
    ],
)
def test_refusals_are_one_line(tmp_path, config, kw, match):
    with pytest.raises(LlmApiArgsError, match=match) as e:
        dy.write_bundle(CONFIGS / f"{config}.yaml", tmp_path / "b", **kw)
    assert "\n" not in str(e.value)
    assert not (tmp_path / "b").exists()


def test_refuses_a_foreign_directory(tmp_path):
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "x").write_text("mine")
    with pytest.raises(LlmApiArgsError, match="not a bundle trt-spec wrote"):
        dy.write_bundle(CONFIGS / "llama31-8b-eagle3-a100.yaml", tmp_path / "b")
    assert (tmp_path / "b" / "x").read_text() == "mine"


def test_cli(tmp_path):
    r = CliRunner().invoke(main, ["deploy", "dynamo", str(CONFIGS / f"{TWO_NODE}.yaml"), "--out", str(tmp_path / "d")])
    assert r.exit_code == 0, r.output
    assert "kubectl apply" in r.output and (tmp_path / "d" / dy.DGD_FILE).is_file()
    r = CliRunner().invoke(
        main, ["deploy", "dynamo", str(CONFIGS / "llama31-8b-a100.yaml"), "--out", str(tmp_path / "e")]
    )
    assert r.exit_code != 0 and "LLM API only" in r.output and "Traceback" not in r.output


DYNAMO_PYTHON = os.environ.get("TRT_SPEC_DYNAMO_PYTHON")


@pytest.mark.skipif(not DYNAMO_PYTHON, reason="TRT_SPEC_DYNAMO_PYTHON unset (a Python with ai-dynamo==1.6.1)")
def test_the_launch_lines_frontend_runs(bundles, tmp_path):
    """launch.sh's frontend line, as written, under the real ai-dynamo 1.6.1 (no GPU, no etcd, no NATS)."""
    launch = (bundles["llama31-8b-eagle3-a100"] / dy.LAUNCH_FILE).read_text().replace("\\\n", " ")
    argv = shlex.split(next(ln for ln in launch.splitlines() if ln.startswith("python3 -m dynamo.frontend")))
    argv = [a for a in argv if a != "&"]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    argv[argv.index("--http-port") + 1] = str(port)
    env = dict(os.environ, DYN_FILE_KV=str(tmp_path / "kv"))
    proc = subprocess.Popen([DYNAMO_PYTHON] + argv[1:], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                    assert json.loads(r.read())["status"] == "healthy"
                break
            except OSError:
                assert proc.poll() is None, proc.stdout.read().decode()
                assert time.monotonic() < deadline, "the frontend did not answer /health in 60 s"
                time.sleep(0.5)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=5) as r:
            assert json.loads(r.read())["object"] == "list"
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _dynamo_package_dir() -> Path:
    out = subprocess.run(
        [DYNAMO_PYTHON, "-c", "import dynamo.profiler, os; print(os.path.dirname(dynamo.profiler.__file__))"],
        capture_output=True,
        text=True,
        check=True,
    )
    return Path(out.stdout.strip())


@pytest.mark.skipif(not DYNAMO_PYTHON, reason="TRT_SPEC_DYNAMO_PYTHON unset (a Python with ai-dynamo==1.6.1)")
def test_the_schema_accepts_dynamos_own_v1beta1_graphs():
    """The vendored schema is transcribed, not generated: the DGDs ai-dynamo 1.6.1 itself ships (its profiler's
    templates, every backend) must pass it closed as trt-spec's own do, or the transcription is wrong."""
    graphs = []
    for f in sorted((_dynamo_package_dir() / "templates" / "dgd").glob("*/*.yaml")):
        graphs += [
            (f, d) for d in yaml.safe_load_all(f.read_text()) if d and (d.get("apiVersion"), d.get("kind")) == DGD_KEY
        ]
    assert len(graphs) >= 3, "ai-dynamo's profiler templates moved: point this test at NVIDIA's own v1beta1 DGDs"
    for f, d in graphs:
        try:
            jsonschema.validate(d, STRICT_CRDS[DGD_KEY], cls=jsonschema.Draft7Validator)
        except jsonschema.ValidationError as e:
            raise AssertionError(f"{f.parent.name}/{f.name}: {e.message}") from None


def test_dynamo_bundles_speak_trtllm_1_3s_decoding_types_and_the_serve_bundle_1_2s(tmp_path):
    """1.3's pydantic union refuses 1.2's "DraftTarget"; 1.2's from_dict refuses "Draft_Target": each bundle its own."""
    from trt_spec.builder.trtllm import TRTLLM_VERSION
    from trt_spec.deploy import trtllm_serve as ts

    assert dy.DYNAMO_TRTLLM_VERSION.startswith("1.3.") and TRTLLM_VERSION.startswith("1.2.")
    cfg = CONFIGS / "smollm2-first-contact-llmapi.yaml"
    spec = yaml.safe_load((dy.write_bundle(cfg, tmp_path / "d") / dy.ENGINE_ARGS_FILE).read_text())[
        "speculative_config"
    ]
    assert spec["decoding_type"] == "Draft_Target" and "speculative_model_dir" not in spec
    assert spec["speculative_model"].endswith("hf/draft")
    out = ts.write_bundle(cfg, tmp_path / "s")
    served = yaml.safe_load((out / "extra_llm_api_options.yaml").read_text())["speculative_config"]
    assert served["decoding_type"] == "DraftTarget" and served["speculative_model_dir"] == spec["speculative_model"]
    assert lc.spec_names("1.3.0rc29")["decoding_types"] == {
        "draft_target": "Draft_Target",
        "ngram": "NGram",
        "eagle3": "Eagle3",
        "mtp": "MTP",
    }
    assert lc.spec_names("1.2.1")["decoding_types"] == lc.DECODING_TYPES
