import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from trt_spec.cli import main
from trt_spec.records.config import load_config

from ..conftest import BUILD_CONFIGS, tool_calls

COMMANDS = [name for name in main.commands] + [
    f"{group} {sub}" for group in ("bench", "deploy") for sub in main.commands[group].commands
]
ROOT = Path(__file__).resolve().parents[2]


def run(*args, **kw):
    return CliRunner().invoke(main, list(args), catch_exceptions=False, **kw)


@pytest.mark.parametrize("cmd", COMMANDS)
def test_help_of_every_command(cmd):
    r = run(*cmd.split(), "--help")
    assert r.exit_code == 0 and "Usage:" in r.output


def test_top_level_help_lists_commands():
    r = run("--help")
    for c in ("plan", "build", "doctor"):
        assert c in r.output


def test_console_script_installed():
    r = subprocess.run([sys.executable, "-m", "trt_spec.cli", "--version"], capture_output=True, text=True)
    assert r.returncode == 0 and "version" in r.stdout


@pytest.mark.parametrize(
    "text,expect",
    [
        ("target: [oops\n", "invalid YAML"),
        ("target:\n  checkpoint: /m\ndraft:\n  checkpoint: /d\nbogus: 1\n", "bogus: unknown key"),
        (
            "target:\n  checkpoint: /m\ndraft:\n  checkpoint: /d\nlimits:\n  max_batch_size: many\n",
            "limits.max_batch_size: Input should be a valid integer",
        ),
    ],
)
def test_bad_config_exit_2_one_line(tmp_path, text, expect):
    p = tmp_path / "bad.yaml"
    p.write_text(text)
    for cmd in ("plan", "build"):
        r = subprocess.run([sys.executable, "-m", "trt_spec.cli", cmd, str(p)], capture_output=True, text=True)
        assert r.returncode == 2
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: ") and expect in lines[0], r.stderr
        assert "Traceback" not in r.stderr


def test_missing_config_file(tmp_path):
    r = subprocess.run(
        [sys.executable, "-m", "trt_spec.cli", "plan", str(tmp_path / "x.yaml")], capture_output=True, text=True
    )
    assert r.returncode == 2 and "config file not found" in r.stderr


def test_preflight_failure_is_exit_2_before_any_tool_runs(fake_build):
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "trt_spec.cli",
            "build",
            str(fake_build["config"]),
            "--set",
            "speculative.num_draft_tokens=9",
        ],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 2 and "num_draft_tokens 9 > max_draft_len 4" in r.stderr
    assert tool_calls(fake_build["log"]) == []


@pytest.mark.parametrize("path", BUILD_CONFIGS, ids=lambda p: p.stem)
def test_plan_json_for_every_config(path):
    # --allow-offload: the 70B/32B configs quantize more than their serving GPUs hold
    # (tests/builder/test_calibration.py)
    r = run("plan", str(path), "--format", "json", "--allow-offload")
    assert r.exit_code == 0, r.output
    j = json.loads(r.output)
    if "runtime: llmapi" in path.read_text():  # nothing to build: the checkpoints are served as they are
        imported = [s["output"] for s in j["steps"] if s["name"] == "import-target"]  # (but a GGUF target's import)
        assert {s["name"] for s in j["steps"]} <= {"import-target", "distill-draft"}
        assert j["engines"]["target"] == (imported or [load_config(path).target.checkpoint])[0]
    else:
        assert j["steps"] and j["engines"]["target"].endswith("engines/target")


def test_plan_gpu_override_changes_quantization():
    path = [p for p in BUILD_CONFIGS if p.stem == "llama33-70b-fp8-h200"][0]
    r = subprocess.run(
        [sys.executable, "-m", "trt_spec.cli", "plan", str(path), "--gpu", "a100-80gb:1"],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 2 and "needs compute capability >= 8.9" in r.stderr


def test_build_cli_reports_failure_with_log_tail_and_rerun(fake_build, monkeypatch):
    monkeypatch.setenv("FAKE_FAIL", "checkpoints/.draft.partial")
    r = subprocess.run(
        [sys.executable, "-m", "trt_spec.cli", "build", str(fake_build["config"])], capture_output=True, text=True
    )
    assert r.returncode == 1
    assert "step checkpoint-draft failed (exit code 3)" in r.stderr
    assert "out of memory" in r.stderr
    assert f"trt-spec build {fake_build['config']} --only checkpoint-draft" in r.stderr


def test_build_cli_dry_run_then_build(fake_build):
    r = run("build", str(fake_build["config"]), "--dry-run")
    assert r.exit_code == 0 and "engine-target: would-run" in r.output
    r = run("build", str(fake_build["config"]))
    assert r.exit_code == 0 and "4 step(s) ran" in r.output and "manifest" in r.output
    # each step: what it does and where its log is, then how long it took (stderr)
    log = fake_build["out"] / "logs" / "engine-target.log"
    assert re.search(rf"\[\d/4\] engine-target: .* \(log: {re.escape(str(log))}\)", r.output), r.output
    assert re.search(r"\[\d/4\] engine-target: done in \d+s", r.output), r.output
    r = run("build", str(fake_build["config"]))
    assert "0 step(s) ran, 4 up to date" in r.output


def test_doctor_lists_what_is_missing():
    r = run("doctor")
    assert r.exit_code == 0
    assert "TensorRT-LLM" in r.output and "tritonserver" in r.output and "blocks:" in r.output


def _options_of(help_text: str) -> set[str]:
    """The options a --help lists (the first word of each option row)."""
    lines = help_text.split("Options:", 1)[1].splitlines()
    return {ln.split()[0].rstrip(",") for ln in lines if ln.startswith("  -")}


SHARED = {"--prompts", "--max-tokens", "--category", "--limit", "--k", "--repeats", "--format", "--policy", "-h"}
SHARED |= {"--predict"}  # bench --predict CONFIG: the GPU performance model at the measured acceptance
SHARED |= {"--turns"}  # bench --turns first|all: Spec-Bench's multi-turn questions as conversations
LOAD = {"--concurrency", "--request-rate", "--num-requests", "--slo-ttft-ms", "--slo-tpot-ms", "--tokenizer", "--out"}
LOAD |= {"--tenant"}  # bench served / openai --tenant NAME: the scope of the BLS's cross-request suffix cache


def test_bench_is_a_group_of_three_modes_each_with_its_own_options():
    out = run("bench", "--help").output
    listed = out.split("Commands:", 1)[1]
    for mode, purpose in (("served", "Triton"), ("openai", "OpenAI-compatible"), ("in-process", "no server")):
        row = next(ln for ln in listed.splitlines() if ln.split()[:1] == [mode])
        assert purpose in row, out
    assert _options_of(run("bench", "served", "--help").output) == SHARED | LOAD | {
        "--url",
        "--protocol",
        "--wait",
        "--admin-key-file",
        "--profile",  # the BLS's return_profile: where the speculative requests' time went
    }
    assert _options_of(run("bench", "openai", "--help").output) == SHARED | LOAD | {
        "--url",
        "--model",
        "--api",
        "--api-key",
    }
    in_process = run("bench", "in-process", "--help").output
    assert _options_of(in_process) == SHARED | {"--ignore-eos", "--threads", "--compare-hf", "--set", "--profile"}
    assert "bench in-process [OPTIONS] CONFIG" in in_process


@pytest.mark.parametrize(
    "args,expect",
    [
        (("served",), "Missing option '--url'"),
        (("openai",), "Missing option '--url'"),
        (("in-process",), "Missing argument 'CONFIG'"),
        (("served", "--url", "h:1", "--ignore-eos"), "--ignore-eos"),
        (("in-process", "c.yaml", "--concurrency", "2"), "--concurrency"),
        (("openai", "--url", "http://h:2", "--protocol", "http"), "--protocol"),
        (("served", "--url", "h:1", "--model", "a"), "--model"),
        (("--url", "h:1"), "--url"),  # the mode comes first
    ],
)
def test_bench_options_of_another_mode_are_refused_exit_2(args, expect):
    """click's usage error: an option only another mode takes is no option of this one."""
    r = run("bench", *args)
    error = r.output.strip().splitlines()[-1]
    assert r.exit_code == 2 and error.startswith("Error: ") and expect in error, r.output
    if expect.startswith("--"):
        assert "No such option" in error


def test_bench_openai_takes_one_or_two_urls_in_one_line():
    r = run("bench", "openai", "--url", "a", "--url", "b", "--url", "c")
    assert r.exit_code == 2 and r.output.strip() == (
        "error: --url takes one URL (both models on it) or two (baseline, speculative), got 3"
    )


@pytest.mark.parametrize("cmd", [("check",), ("bench", "served", "--url", "127.0.0.1:1"), ("tune",)])
def test_prompts_option_names_a_missing_file_in_one_line(cmd, tmp_path):
    missing = str(tmp_path / "none.jsonl")
    r = run(*cmd, "--prompts", missing)
    assert r.exit_code == 2 and f"prompt set '{missing}'" in r.output


def test_option_defaults_come_from_the_defaults_module():
    from trt_spec.records import defaults

    serve = run("serve", "--help").output
    for opt, value in (
        ("--http-port", defaults.HTTP_PORT),
        ("--grpc-port", defaults.GRPC_PORT),
        ("--metrics-port", defaults.METRICS_PORT),
        ("--host", defaults.HOST),
        (
            "--timeout",
            f"{defaults.READY_TIMEOUT_S:.0f} + {defaults.READY_S_PER_ENGINE_GIB:.0f} per GiB of engine files",
        ),
    ):
        assert f"[default: {value}]" in " ".join(serve.split(opt, 1)[1].split("\n  --", 1)[0].split())
    for cmd in ("check", "tune"):
        assert f"[default: {defaults.URL}]" in run(cmd, "--help").output
    tune = " ".join(run("tune", "--help").output.split())
    assert f"[default: {', '.join(map(str, defaults.TUNE_KS))}]" in tune
    demo = " ".join(run("demo", "--help").output.split())
    assert defaults.DEMO_CONFIG in demo.replace("- ", "-") and f"[default: {defaults.DEMO_OUT}]" in demo


def test_doctor_fails_in_one_line_on_another_tensorrt_llm(monkeypatch):
    """The 25.12 image ships TensorRT-LLM 1.1.0; engines and the tensorrtllm backend must be 1.2.1's."""
    from trt_spec.builder import trtllm

    monkeypatch.setattr(trtllm, "dist_version", lambda d: "1.1.0" if d == "tensorrt_llm" else None)
    r = CliRunner().invoke(main, ["doctor"])
    assert r.exit_code == 2
    last = r.output.strip().splitlines()[-1]
    assert last == (
        "error: TensorRT-LLM 1.1.0 is installed, but trt-spec targets 1.2.1 (engines and the tensorrtllm "
        "backend must match it); use the image nvcr.io/nvidia/tritonserver:26.04-trtllm-python-py3"
    )
    monkeypatch.setattr(trtllm, "dist_version", lambda d: "1.2.1" if d == "tensorrt_llm" else None)
    r = CliRunner().invoke(main, ["doctor"])
    assert r.exit_code == 0 and "1.2.1 (trt-spec targets 1.2.1)" in r.output


@pytest.mark.parametrize(
    "args",
    [
        ["deploy", "k8s", "build_configs/llama33-70b-fp8-h100-tp2.yaml", "--out", "/sys/trt-spec-test-out"],
        ["build", "build_configs/cpu-smollm2-ngram.yaml", "--set", "output_dir=/sys/trt-spec-test-out"],
    ],
)
def test_an_unwritable_output_dir_is_one_line_exit_2(args):
    """As a user runs it (a subprocess): a directory nobody may write to (sysfs: EPERM/EACCES even for root) gives
    one line naming the path and the fix, exit 2, no traceback."""
    r = subprocess.run([sys.executable, "-m", "trt_spec.cli", *args], capture_output=True, text=True, cwd=ROOT)
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert len(errors) == 1 and "/sys/trt-spec-test-out" in errors[0] and "write somewhere you may write" in errors[0]


def test_an_internal_fault_is_one_line_naming_the_trace_file(monkeypatch):
    import trt_spec.cli as cli

    def boom(*a, **k):
        raise RuntimeError("something of ours broke\nsecond line")

    monkeypatch.setattr(cli, "_plan_for", boom)
    r = CliRunner().invoke(main, ["plan", "build_configs/cpu-smollm2-ngram.yaml"])
    assert r.exit_code == 1
    (line,) = r.output.strip().splitlines()
    assert line.startswith("error: internal error (RuntimeError: something of ours broke); the full trace is in ")
    trace = open(line.split("the full trace is in ")[1].split(" ")[0]).read()
    assert "Traceback" in trace and "second line" in trace
