"""trt-spec deploy k8s: the chart rendered by Helm's own engine (helm-python-sdk: Helm v4 Go SDK), every object
validated against the Kubernetes OpenAPI schemas (kubernetes-validate, pinned version) or the vendored CRD schemas
(tests/data/crds, upstream URL + version inside), goldens, GPU counts, probes, HPA/adapter, alert threshold, errors."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import helm_python as helm
import jsonschema
import kubernetes_validate
import pytest
import yaml
from click.testing import CliRunner

from trt_spec.builder.model_info import KNOWN_MODELS
from trt_spec.cli import main
from trt_spec.deploy.k8s import ADAPTER_VALUES, DeployError, write_chart
from trt_spec.records import defaults
from trt_spec.records.speculation import break_even_acceptance

from ..conftest import REPO

K8S_VERSION = "1.34.0"  # the Kubernetes API the manifests must satisfy (strict: unknown fields refused)
CONFIGS = REPO / "build_configs"
GOLDEN = REPO / "tests" / "golden" / "k8s"
UPDATE = os.environ.get("TRT_SPEC_UPDATE_GOLDENS") == "1"
CRDS = {
    (d["apiVersion"], d["kind"]): d
    for d in (json.loads(f.read_text()) for f in (REPO / "tests" / "data" / "crds").glob("*.json"))
}
GPU_CONFIGS = {  # shipped GPU configs -> GPUs the plan needs (target TP x PP, plus the draft's own GPUs)
    "llama33-70b-fp8-h100-tp2": 2,
    "llama33-70b-fp8-h200": 1,
    "qwen25-coder-32b-fp8-h100": 1,
    "llama31-8b-a100": 1,
    "qwen25-coder-32b-ngram-h100": 1,
    "vicuna-7b-medusa-fp8-h100": 1,
    "vicuna-7b-eagle-h100": 1,
    "llama31-8b-lookahead-fp8-h100": 1,  # in-engine EAGLE and lookahead (+ baseline engine)
    # runtime llmapi: the LLM API loads the EAGLE-3 head or MTP layers on the target's GPUs
    "llama33-70b-eagle3-h200": 1,
    "llama33-70b-eagle3-h100-tp2": 2,
    "llama31-8b-eagle3-a100": 1,
    "deepseek-v3-mtp-h200": 8,
    "llama31-8b-ngram-llmapi-h100": 1,
}
SEED = CONFIGS / "llama33-70b-fp8-h100-tp2.yaml"


class _Dumper(yaml.SafeDumper):
    """Goldens readable in a diff: multi-line strings (scripts, the build config) as literal blocks."""


_Dumper.add_representer(
    str, lambda d, s: d.represent_scalar("tag:yaml.org,2002:str", s, style="|" if "\n" in s else None)
)


def dump(objs: list[dict]) -> str:
    return yaml.dump_all(objs, Dumper=_Dumper, sort_keys=True, width=120)


def render(chart: Path, values: dict | None = None) -> list[dict]:
    with helm.Chart.load(str(chart)) as c:
        out = c.render(values, name="rel", namespace="serving")
    return [d for name, text in sorted(out.items()) if name.endswith(".yaml") for d in yaml.safe_load_all(text) if d]


def by_kind(objs: list[dict]) -> dict[str, dict]:
    return {o["kind"]: o for o in objs}


@pytest.fixture(scope="module")
def charts(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("charts")
    return {name: write_chart(CONFIGS / f"{name}.yaml", root / name) for name in GPU_CONFIGS}


@pytest.fixture(scope="module")
def rendered(charts) -> dict[str, list[dict]]:
    return {name: render(path) for name, path in charts.items()}


def test_every_gpu_config_is_covered():
    gpu = {
        p.stem for p in CONFIGS.glob("*.yaml") if yaml.safe_load(p.read_text()).get("engine", "tensorrt") == "tensorrt"
    }
    assert gpu == set(GPU_CONFIGS) | FIRST_CONTACT | KERNEL_TWIN | MULTI_NODE


FIRST_CONTACT = {"smollm2-first-contact-fp8", "smollm2-first-contact-llmapi"}  # make gpu-smoke's, one host
KERNEL_TWIN = {"kernel-twin-llama70b-shape", "kernel-twin-llama70b-shape-tp2"}  # make gpu-smoke writes their weights
MULTI_NODE = {"deepseek-v3-mtp-h100-2node"}  # 16 GPUs over two 8-GPU nodes: deploy dynamo / trtllm-serve


@pytest.mark.parametrize("name", sorted(MULTI_NODE))
def test_multi_node_configs_are_refused_on_8_gpu_nodes(name, tmp_path):
    with pytest.raises(DeployError, match="multi-node launch is not supported"):
        write_chart(CONFIGS / f"{name}.yaml", tmp_path / "chart", gpus_per_node=8)


@pytest.mark.parametrize("name", sorted(FIRST_CONTACT))
def test_first_contact_configs_are_refused_in_one_line(name, tmp_path):
    with pytest.raises(DeployError, match="built on one host .*make gpu-smoke"):
        write_chart(CONFIGS / f"{name}.yaml", tmp_path / "chart")


@pytest.mark.parametrize("name", GPU_CONFIGS)
def test_golden_render(rendered, name):
    got = dump(rendered[name])
    golden = GOLDEN / f"{name}.yaml"
    if UPDATE:
        golden.parent.mkdir(parents=True, exist_ok=True)
        golden.write_text(got)
    assert golden.is_file(), f"missing golden {golden}; run TRT_SPEC_UPDATE_GOLDENS=1 pytest tests/deploy/test_k8s.py"
    assert got == golden.read_text()


def _strict(schema):
    """CRD schemas leave additionalProperties open (the API server prunes unknown fields silently): close every object
    that lists its properties, so a misspelt field fails here."""
    if isinstance(schema, dict):
        schema = {k: _strict(v) for k, v in schema.items()}
        if str(schema.get("pattern", "")).startswith("^(?i)"):  # Go's RE2 takes a flag there, Python's re only first
            schema["pattern"] = "(?i)^" + schema["pattern"][5:]
        if (
            "properties" in schema
            and "additionalProperties" not in schema
            and not schema.get("x-kubernetes-preserve-unknown-fields")
        ):
            schema["additionalProperties"] = False
        return schema
    if isinstance(schema, list):
        return [_strict(v) for v in schema]
    return schema


STRICT_CRDS = {k: _strict(d["schema"]) for k, d in CRDS.items()}


def validate(obj: dict) -> None:
    key = (obj["apiVersion"], obj["kind"])
    if key in STRICT_CRDS:
        jsonschema.validate(obj, STRICT_CRDS[key], cls=jsonschema.Draft7Validator)
    else:
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


@pytest.mark.parametrize("name", GPU_CONFIGS)
def test_every_object_validates(rendered, name):
    kinds = sorted(o["kind"] for o in rendered[name])
    assert kinds == sorted(
        [
            "ConfigMap",
            "ConfigMap",
            "HorizontalPodAutoscaler",
            "Job",
            "PersistentVolumeClaim",
            "PodDisruptionBudget",
            "PodMonitor",
            "PrometheusRule",
            "Service",
            "Deployment",
        ]
    )
    for obj in rendered[name]:
        validate(obj)


def test_validation_can_fail(rendered):
    dep = json.loads(json.dumps(by_kind(rendered["llama33-70b-fp8-h200"])["Deployment"]))
    dep["spec"]["template"]["spec"]["containers"][0]["startupprobe"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        validate(dep)
    pm = json.loads(json.dumps(by_kind(rendered["llama33-70b-fp8-h200"])["PodMonitor"]))
    pm["spec"]["podMetricsEndpoints"][0]["prot"] = "metrics"
    with pytest.raises(jsonschema.ValidationError):
        validate(pm)


def _server_pods(objs):
    return [by_kind(objs)["Deployment"]["spec"]["template"]]


@pytest.mark.parametrize("name", GPU_CONFIGS)
def test_gpus_equal_the_plans_ranks(rendered, name):
    (pod,) = _server_pods(rendered[name])
    res = pod["spec"]["containers"][0]["resources"]
    assert res["limits"]["nvidia.com/gpu"] == res["requests"]["nvidia.com/gpu"] == GPU_CONFIGS[name]


def test_server_pod(rendered):
    (pod,) = _server_pods(rendered["llama33-70b-fp8-h100-tp2"])
    spec = pod["spec"]
    c = spec["containers"][0]
    assert c["image"] == "nvcr.io/nvidia/tritonserver:26.04-trtllm-python-py3"
    assert c["command"][:5] == ["python3", "-m", "trt_spec.cli", "serve", "/models/repo/llama33-70b-fp8-h100-tp2"]
    assert "--host=0.0.0.0" in c["command"] and "--timeout=3600" in c["command"]
    assert {p["name"]: p["containerPort"] for p in c["ports"]} == {
        "http": 8000,
        "grpc": 8001,
        "metrics": 8002,
        "openai": 9000,
    }
    assert "--openai-port=9000" in c["command"]
    assert c["startupProbe"] == {
        "httpGet": {"path": "/v2/health/ready", "port": "http"},
        "periodSeconds": 10,
        "failureThreshold": 360,
    }
    assert c["readinessProbe"]["httpGet"] == {"path": "/v2/health/ready", "port": "http"}
    assert c["livenessProbe"]["httpGet"] == {"path": "/v2/health/live", "port": "http"}
    shm = {v["name"]: v for v in spec["volumes"]}["dshm"]
    assert shm["emptyDir"] == {"medium": "Memory", "sizeLimit": "16Gi"}
    assert {m["name"]: m["mountPath"] for m in c["volumeMounts"]}["dshm"] == "/dev/shm"
    assert {v["name"]: v for v in spec["volumes"]}["models"]["persistentVolumeClaim"][
        "claimName"
    ] == "rel-llama33-70b-fp8-h100-tp2-models"
    assert spec["securityContext"]["runAsNonRoot"] is True and spec["securityContext"]["runAsUser"] == 1000
    assert {e["name"]: e["value"] for e in c["env"]}["TRTLLM_ORCHESTRATOR"] == "1"  # draft + TP2: orchestrator mode
    assert [i["name"] for i in spec["initContainers"]] == ["install-trt-spec", "wait-for-repository"]
    # SIGTERM: preStop sleeps, then serve drains for --drain-timeout; the grace period covers both and the stop
    sleep = int(c["lifecycle"]["preStop"]["exec"]["command"][1])
    drain = float(next(a for a in c["command"] if a.startswith("--drain-timeout=")).split("=")[1])
    assert (
        c["lifecycle"]["preStop"]["exec"]["command"][0] == "sleep" and sleep >= 1 and drain == defaults.DRAIN_TIMEOUT_S
    )
    assert spec["terminationGracePeriodSeconds"] >= sleep + drain + defaults.DRAIN_CUT_GRACE_S + defaults.EXIT_TIMEOUT_S


def test_service_and_build_job(rendered):
    k = by_kind(rendered["llama33-70b-fp8-h100-tp2"])
    assert [(p["name"], p["port"], p["targetPort"]) for p in k["Service"]["spec"]["ports"]] == [
        ("http", 8000, "http"),
        ("grpc", 8001, "grpc"),
        ("metrics", 8002, "metrics"),
        ("openai", 9000, "openai"),
    ]
    script = k["Job"]["spec"]["template"]["spec"]["containers"][0]["command"][2]
    assert "python3 -m trt_spec.cli build /etc/trt-spec/llama33-70b-fp8-h100-tp2.yaml\n" in script
    assert (
        "python3 -m trt_spec.cli repo /models/build/llama33-70b-fp8-h100-tp2 --out "
        "/models/repo/llama33-70b-fp8-h100-tp2" in script
    )
    cfg = yaml.safe_load(_config_map(rendered["llama33-70b-fp8-h100-tp2"])["data"]["llama33-70b-fp8-h100-tp2.yaml"])
    assert cfg["output_dir"] == "/models/build/llama33-70b-fp8-h100-tp2" and cfg["target"]["tp"] == 2
    # the pre-quantized FP8 target is converted, only the 1B draft calibrated: the 2 H100s it serves on
    res = k["Job"]["spec"]["template"]["spec"]["containers"][0]["resources"]
    assert res["limits"]["nvidia.com/gpu"] == 2 and res["limits"]["memory"] == "208Gi"


def test_a_node_too_small_to_calibrate_is_refused_with_the_fix(tmp_path):
    """The BF16 70B served from one H100 at batch 1: its calibration (records/memory.py calibration_peak) needs two."""
    cfg = yaml.safe_load(SEED.read_text())
    cfg.update(gpu="h100:1", serving={}, target={"checkpoint": "/models/Llama-3.3-70B-Instruct", "tp": 1})
    cfg["limits"] = {"max_batch_size": 1, "max_input_len": 2048, "max_seq_len": 4096, "max_num_tokens": 4096}
    (tmp_path / "bf16.yaml").write_text(yaml.safe_dump(cfg))
    with pytest.raises(
        DeployError,
        match=r"calibrating for fp8 holds up to ~\d+ GiB .* 2 x h100 .*--gpus-per-node is 1; build on nodes with >= 2",
    ):
        write_chart(tmp_path / "bf16.yaml", tmp_path / "c", gpus_per_node=1)
    assert not (tmp_path / "c").exists()


def test_build_config_loads(rendered, tmp_path):
    from trt_spec.records.config import load_config

    text = _config_map(rendered["llama33-70b-fp8-h100-tp2"])["data"]["llama33-70b-fp8-h100-tp2.yaml"]
    (tmp_path / "c.yaml").write_text(text)
    assert load_config(tmp_path / "c.yaml").resolved_name(None) == "llama33-70b-fp8-h100-tp2"


def _config_map(objs, suffix="-config"):
    (cm,) = [o for o in objs if o["kind"] == "ConfigMap" and o["metadata"]["name"].endswith(suffix)]
    return cm


def test_hpa_metric_is_nvidias_recorded_ratio_served_by_the_adapter(charts, rendered):
    """Spelled as NVIDIA's Triton autoscaling tutorial spells it: a recording rule triton:queue_compute:ratio =
    rate(nv_inference_queue_duration_us[1m]) / clamp_min(rate(nv_inference_compute_infer_duration_us[1m]), 1), which
    prometheus-adapter serves to the HPA under the same name."""
    objs = rendered["llama33-70b-fp8-h200"]
    hpa = by_kind(objs)["HorizontalPodAutoscaler"]
    (metric,) = hpa["spec"]["metrics"]
    rule = yaml.safe_load((charts["llama33-70b-fp8-h200"] / ADAPTER_VALUES).read_text())["rules"]["custom"][0]
    assert (
        metric["pods"]["metric"]["name"]
        == rule["name"]["as"]
        == defaults.QUEUE_COMPUTE_METRIC
        == "triton:queue_compute:ratio"
    )
    assert rule["seriesQuery"].startswith("triton:queue_compute:ratio{")
    (group,) = [g for g in by_kind(objs)["PrometheusRule"]["spec"]["groups"] if g["name"] == "trt-spec-autoscaling"]
    (recorded,) = group["rules"]
    assert recorded == {
        "record": "triton:queue_compute:ratio",
        "expr": "rate(nv_inference_queue_duration_us[1m]) / "
        "clamp_min(rate(nv_inference_compute_infer_duration_us[1m]), 1)",
    }
    assert hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": "rel-llama33-70b-fp8-h200",
    }


def _threshold(objs) -> float:
    (group,) = [g for g in by_kind(objs)["PrometheusRule"]["spec"]["groups"] if g["name"] == "trt-spec-speculation"]
    (rule,) = group["rules"]
    m = re.fullmatch(
        r"sum by \(model\) \(rate\(trt_spec_accepted_draft_tokens_total\[10m\]\)\) / sum by \(model\) "
        r"\(rate\(trt_spec_draft_tokens_total\[10m\]\)\) < (\S+)",
        rule["expr"],
    )
    assert m, rule["expr"]
    return float(m.group(1))


def test_alert_threshold_is_break_even(rendered):
    c = KNOWN_MODELS["llama-3.2-1b-instruct"].num_params / KNOWN_MODELS["llama-3.3-70b-instruct"].num_params
    assert _threshold(rendered["llama33-70b-fp8-h200"]) == pytest.approx(break_even_acceptance(5, c, 1.0), rel=1e-9)
    assert 0.015 < c < 0.02
    assert _threshold(rendered["qwen25-coder-32b-ngram-h100"]) == 0.0  # draft-free: c = 0, r = 1


def test_min_acceptance_override(tmp_path):
    objs = render(write_chart(SEED, tmp_path / "c", min_acceptance=0.3))
    assert _threshold(objs) == 0.3


def test_multi_node_is_refused_by_the_command_and_by_the_template(charts, tmp_path):
    """NVIDIA's multi-node launch (leader mode over kubectl exec, num_nodes with gpu_device_ids, no orchestrator mode)
    is not what trt-spec can start or test: a plan larger than a node gets one line, from `deploy k8s` and from a
    chart whose gpusPerNode is lowered at install time, instead of a LeaderWorkerSet that cannot start."""
    r = run_cli(SEED, "--gpus-per-node", "1", "--out", tmp_path / "c")
    assert r.exit_code == 2 and not (tmp_path / "c").exists()
    assert r.output.strip() == (
        "error: llama33-70b-fp8-h100-tp2: the plan needs 2 GPUs but nodes have 1; trt-spec "
        "serves a replica on one node (multi-node launch is not supported here): use nodes with >= 2 "
        "GPUs, or lower the target's tp x pp; a runtime: llmapi config runs across nodes with trt-spec deploy "
        "dynamo or deploy trtllm-serve"
    )
    with pytest.raises(
        helm.HelmRenderError,
        match="the plan needs 2 GPUs but gpusPerNode is 1: trt-spec serves one replica on one node",
    ):
        render(charts["llama33-70b-fp8-h100-tp2"], {"gpusPerNode": 1})


# -- errors: one line, nothing written ---------------------------------------------------------------------------


def run_cli(*args):
    return CliRunner().invoke(main, ["deploy", "k8s", *map(str, args)], catch_exceptions=False)


@pytest.mark.parametrize(
    "args,expect",
    [
        ([CONFIGS / "cpu-smollm2-ngram.yaml"], "is the CPU reference deployment; the Kubernetes bundle is for the GPU"),
        (["build/no-such-build"], "no such build directory or config"),
        (
            [
                SEED,
                "--gpu",
                "h100:3",
                "--set",
                "runtime.gpu_device_ids=[0,1]",
                "--set",
                "runtime.draft_gpu_device_ids=[2]",
                "--gpus-per-node",
                "2",
            ],
            "the plan needs 3 GPUs but nodes have 2",
        ),
        (
            [
                CONFIGS / "llama33-70b-fp8-h200.yaml",
                "--gpu",
                "h200:2",
                "--set",
                "runtime.draft_gpu_device_ids=[1]",
                "--gpus-per-node",
                "1",
            ],
            "the plan needs 2 GPUs but nodes have 1",
        ),
    ],
)
def test_bad_input_one_line(tmp_path, args, expect):
    out = tmp_path / "chart"
    r = run_cli(*args, "--out", out)
    assert r.exit_code == 2, r.output
    assert expect in r.output and r.output.count("\n") == 1 and r.output.startswith("error: ")
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_missing_and_damaged_build_dir(tmp_path):
    bdir = tmp_path / "b"
    bdir.mkdir()
    r = run_cli(bdir, "--out", tmp_path / "c")
    assert r.exit_code == 2 and "no manifest.json; run `trt-spec build CONFIG` first" in r.output
    (bdir / "manifest.json").write_text("{")
    r = run_cli(bdir, "--out", tmp_path / "c")
    assert r.exit_code == 2 and "not a trt-spec build manifest (not JSON" in r.output
    assert r.output.count("\n") == 1 and not (tmp_path / "c").exists()


def test_cli_writes_and_rewrites(tmp_path):
    out = tmp_path / "chart"
    for _ in range(2):  # a rerun replaces the chart
        r = run_cli(CONFIGS / "llama33-70b-fp8-h200.yaml", "--out", out)
        assert r.exit_code == 0, r.output
    assert sorted(p.name for p in out.iterdir()) == [
        "Chart.yaml",
        "dashboards",
        ADAPTER_VALUES,
        "templates",
        "values.yaml",
    ]
    assert [p.name for p in tmp_path.iterdir()] == ["chart"]
    with pytest.raises(DeployError):
        write_chart(CONFIGS / "llama33-70b-fp8-h200.yaml", tmp_path / "chart" / "templates")  # not a chart dir


def test_values_every_knob_documented(charts):
    values = yaml.safe_load((charts["llama33-70b-fp8-h200"] / "values.yaml").read_text())
    assert values["gpusPerNode"] == 1 and values["plan"]["ranks"] == 1
    assert values["service"]["ports"] == {
        "http": defaults.HTTP_PORT,
        "grpc": defaults.GRPC_PORT,
        "metrics": defaults.METRICS_PORT,
        "openai": defaults.OPENAI_PORT,
    }
    assert helm.lint(str(charts["llama33-70b-fp8-h200"]))["errors"] == []


def test_image_with_trt_spec_installed(charts):
    objs = render(
        charts["llama33-70b-fp8-h100-tp2"],
        {"trtSpec": {"pipInstall": ""}, "image": {"repository": "registry.example/triton-trt-spec", "tag": "1"}},
    )
    for obj in objs:
        validate(obj)
    job = by_kind(objs)["Job"]["spec"]["template"]["spec"]
    assert "initContainers" not in job and job["containers"][0]["image"] == "registry.example/triton-trt-spec:1"
    for pod in _server_pods(objs):
        assert "PYTHONPATH" not in {e["name"] for e in pod["spec"]["containers"][0]["env"]}
        assert [i["name"] for i in pod["spec"].get("initContainers", [])] in ([], ["wait-for-repository"])


def test_draft_with_its_own_gpu_counts(tmp_path):
    chart = write_chart(
        CONFIGS / "llama33-70b-fp8-h200.yaml", tmp_path / "c", gpu="h200:2", sets=["runtime.draft_gpu_device_ids=[1]"]
    )
    (pod,) = _server_pods(render(chart))
    assert pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == 2  # target GPU 0 + draft GPU 1
    with pytest.raises(helm.HelmRenderError, match="the plan needs 2 GPUs but gpusPerNode is 1"):
        render(chart, {"gpusPerNode": 1})


def test_from_a_build_dir_equals_from_its_config(tmp_path, rendered):
    from trt_spec.builder.pipeline import manifest_for_config

    manifest_for_config(SEED).write(tmp_path / "build")
    objs = render(write_chart(tmp_path / "build", tmp_path / "c"))
    assert dump(objs) == dump(rendered["llama33-70b-fp8-h100-tp2"])


def test_every_top_level_knob_has_a_comment(charts):
    lines = (charts["llama33-70b-fp8-h200"] / "values.yaml").read_text().splitlines()
    keys = [i for i, ln in enumerate(lines) if re.match(r"[A-Za-z]\w*:", ln)]
    assert len(keys) == 23
    for i in keys:
        j = i - 1
        while j in keys and ": " in lines[j]:  # one-line knobs sharing the comment above them
            j -= 1
        assert lines[j].startswith("#"), f"values.yaml: {lines[i]!r} has no comment above it"


def test_the_launch_line_is_a_pure_function_of_the_repository_record(monkeypatch):
    """No repository is written (or read) to compute the pod's launch line: it comes from the record `trt-spec repo`
    will write, computed from the manifest."""
    from trt_spec.deploy import k8s
    from trt_spec.repository import writer as repository

    monkeypatch.setattr(repository, "write_repository", lambda *a, **k: pytest.fail("the chart wrote a repository"))
    argv, spec = k8s.launch(k8s.load_manifest(SEED), "/models/repo/seed", admin_key=False)
    assert argv[:4] == ["mpirun", "--allow-run-as-root", "-n", "1"]  # the TP2 target + draft: orchestrator mode
    assert "--model-repository=/models/repo/seed" in argv
    assert "--backend-config=python,shm-region-prefix-name=trtspec_0_" in argv
    assert spec.env == {"TRTLLM_ORCHESTRATOR": "1", "TRTLLM_ORCHESTRATOR_SPAWN_PROCESSES": "1"}


def test_grafana_dashboard_ships_with_the_chart_and_reads_published_metrics(rendered):
    """The dashboard ConfigMap carries the shipped JSON; every metric its panels query is one trt-spec publishes (the
    BLS's and the frontend's names, Triton's own, the recorded HPA ratio); tests/e2e/test_openai.py scrapes them."""
    from trt_spec.records import names as n
    from trt_spec.serve.openai.metrics import FRONTEND_METRICS

    cm = _config_map(rendered["llama33-70b-fp8-h200"], "-dashboard")
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    dash = json.loads(cm["data"]["trt-spec.json"])
    assert dash["uid"] == "trt-spec-speculation"
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    titles = {p["title"] for p in dash["panels"]}
    assert {
        "Draft acceptance rate",
        "Mean acceptance length",
        "Acceptance per draft position",
        "Rounds without speculation",
        "Time to first token",
        "Inter-token latency",
        "Queue / compute",
    } <= titles
    published = {getattr(n, k) for k in dir(n) if k.startswith(("METRIC_", "VLLM_")) and isinstance(getattr(n, k), str)}
    published |= set(FRONTEND_METRICS) | {defaults.QUEUE_COMPUTE_METRIC}
    for expr in exprs:
        used = set(re.findall(r"(?<![\w:$])([a-zA-Z_][a-zA-Z0-9_]*:[a-zA-Z0-9_:]+|trt_spec_[a-z_]+)", expr))
        for name in used:
            base = re.sub(r"_(bucket|sum|count)$", "", name)
            assert name in published or base in published, (name, expr)
    # the mean acceptance length is the one definition: 1 + accepted / speculative rounds (vLLM's drafts)
    (mal,) = [p for p in dash["panels"] if p["title"] == "Mean acceptance length"]
    assert mal["targets"][0]["expr"].startswith("1 + ") and n.VLLM_NUM_DRAFTS in mal["targets"][0]["expr"]


def _openai_pod(objs):
    (pod,) = _server_pods(objs)
    return pod["spec"], pod["spec"]["containers"][0]


def test_openai_key_comes_from_a_secret_by_default(charts, rendered):
    """`deploy k8s` asks for the OpenAI key by default: the pod reads it from a read-only Secret volume (0400), by
    file (never on the command line, where `ps` or the pod spec would show it), and NOTES says how to make it."""
    values = yaml.safe_load((charts["llama33-70b-fp8-h100-tp2"] / "values.yaml").read_text())["server"]
    secret = "llama33-70b-fp8-h100-tp2-openai-key"
    assert (values["openaiApiKeySecret"], values["openaiApiKeySecretKey"]) == (secret, "key")
    assert values["openaiAllowUnauthenticated"] is False
    spec, c = _openai_pod(rendered["llama33-70b-fp8-h100-tp2"])
    assert "--openai-api-key-file=/var/run/trt-spec/openai/key" in c["command"]
    assert "--openai-allow-unauthenticated" not in c["command"]
    vol = {v["name"]: v for v in spec["volumes"]}["openai-key"]["secret"]
    assert vol == {"secretName": secret, "defaultMode": 0o400, "items": [{"key": "key", "path": "key"}]}
    mount = {m["name"]: m for m in c["volumeMounts"]}["openai-key"]
    assert mount == {"name": "openai-key", "mountPath": "/var/run/trt-spec/openai", "readOnly": True}
    with helm.Chart.load(str(charts["llama33-70b-fp8-h100-tp2"])) as ch:
        notes = ch.render(None, name="rel", namespace="serving")["llama33-70b-fp8-h100-tp2/templates/NOTES.txt"]
    assert f"kubectl create secret generic {secret} --from-literal=key=" in notes
    assert "Authorization: Bearer" in notes


def test_openai_without_a_key_fails_the_render_in_one_line_unless_allowed(charts):
    chart = charts["llama33-70b-fp8-h100-tp2"]
    with pytest.raises(helm.HelmRenderError) as e:
        render(chart, {"server": {"openaiApiKeySecret": ""}})
    msg = str(e.value)
    assert "\n" not in msg.strip()
    assert "server.openaiApiKeySecret" in msg and "server.openaiAllowUnauthenticated" in msg
    assert "kubectl create secret generic llama33-70b-fp8-h100-tp2-openai-key" in msg
    spec, c = _openai_pod(render(chart, {"server": {"openaiApiKeySecret": "", "openaiAllowUnauthenticated": True}}))
    assert "--openai-allow-unauthenticated" in c["command"]
    assert not any(a.startswith("--openai-api-key-file") for a in c["command"])
    assert "openai-key" not in {v["name"] for v in spec["volumes"]}
    # without the OpenAI port, no key is asked for and none is mounted
    spec, c = _openai_pod(render(chart, {"server": {"openai": False, "openaiApiKeySecret": ""}}))
    assert not any("openai" in a for a in c["command"]) and "openai-key" not in {v["name"] for v in spec["volumes"]}
