"""Plan goldens for every shipped build config (exact argv) + the NVIDIA recipe rules they must follow."""

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from trt_spec.builder import calibration
from trt_spec.builder import trtllm as F
from trt_spec.builder.hardware import resolve_gpu
from trt_spec.builder.model_info import PreflightError
from trt_spec.builder.plan import make_plan
from trt_spec.builder.preflight import run_preflight
from trt_spec.builder.quantize_peak import PEAK_MODULE, PEAK_SUFFIX
from trt_spec.records.config import load_config
from trt_spec.records.speculation import Mode

from ..conftest import BUILD_CONFIGS, REPO, tool_calls, write_fake_tools

GOLDEN = REPO / "tests" / "golden" / "plans"
UPDATE = os.environ.get("TRT_SPEC_UPDATE_GOLDENS") == "1"


def plan_of(path: Path, sets=(), allow_offload=True):
    """The plan of a shipped config on the GPUs it names (with --allow-offload: the 70B and 32B configs calibrate more
    than their serving GPUs hold; tests/builder/test_preflight.py proves the refusal)."""
    cfg = load_config(path, sets)
    report = run_preflight(cfg, resolve_gpu(cfg.gpu), require_checkpoints=False, allow_offload=allow_offload)
    return make_plan(cfg, report, path)


def arg(argv, flag):
    return argv[argv.index(flag) + 1]


@pytest.mark.parametrize("path", BUILD_CONFIGS, ids=lambda p: p.stem)
def test_plan_matches_golden(path):
    p = plan_of(path)
    # reference steps run this interpreter; the bundled calibration set lies inside this checkout or install
    bundled = str(calibration.resolve(calibration.BUNDLED_CALIB_DATASET))
    norm = lambda a: "PYTHON" if a == sys.executable else "BUNDLED_CALIB_DATASET" if a == bundled else a  # noqa: E731
    got = {
        "quantization": p.to_json()["quantization"],
        "max_draft_len": p.report.max_draft_len,
        "steps": [{"name": s.name, "argv": [norm(a) for a in s.argv]} for s in p.steps],
    }
    golden = GOLDEN / f"{path.stem}.json"
    if UPDATE:
        golden.write_text(json.dumps(got, indent=2) + "\n")
    assert golden.is_file(), f"missing golden {golden}; run TRT_SPEC_UPDATE_GOLDENS=1 pytest tests/builder/test_plan.py"
    assert got == json.loads(golden.read_text())


# trtllm-build configs (runtime engine); runtime llmapi builds nothing (tests/repository/test_llmapi.py)
TRT_CONFIGS = [p for p in BUILD_CONFIGS if not p.stem.startswith("cpu-") and "runtime: llmapi" not in p.read_text()]


@pytest.mark.parametrize("path", TRT_CONFIGS, ids=lambda p: p.stem)
def test_plan_follows_trtllm_recipe(path):
    p = plan_of(path)
    cfg = p.report.config
    assert cfg.engine == "tensorrt"
    k = p.report.max_draft_len
    for s in p.steps:
        argv = list(s.argv)
        if s.name in ("import-target", "distill-draft"):  # a GGUF target / distilled draft: trt-spec's own, this python
            assert argv[:3] == [
                sys.executable,
                "-m",
                f"trt_spec.reference.{'checkpoints' if 'import' in s.name else 'distill'}",
            ]
            continue
        if s.name.startswith("engine-"):
            flags = {a for a in argv if a.startswith("--")}
            assert flags <= F.TRTLLM_BUILD_FLAGS
            assert arg(argv, "--use_paged_context_fmha") == "enable"  # KV-cache reuse (DTM rule)
            assert "--gather_context_logits" not in argv  # error with max_draft_len > 0
            for explicit in (
                "--gpt_attention_plugin",
                "--gemm_plugin",
                "--use_fp8_context_fmha",
                "--tokens_per_block",
                "--remove_input_padding",
                "--kv_cache_type",
            ):
                assert explicit in argv, explicit
            role = s.name.split("-", 1)[1]
            model = cfg.draft if role == "draft" else cfg.target  # the baseline is the target, built plain
            assert arg(argv, "--workers") == str(model.world_size)
            assert arg(argv, "--max_seq_len") == str(cfg.limits.max_seq_len)
            if role == "target":
                mode = arg(argv, "--speculative_decoding_mode")
                assert mode in F.SPECULATIVE_DECODING_MODES
                if cfg.speculative.mode in ("draft_target", "ngram"):
                    assert mode == "draft_tokens_external" and arg(argv, "--max_draft_len") == str(k) and k >= 1
            else:
                assert "--speculative_decoding_mode" not in argv
            # the engine that serves the baseline returns logits (check's near-tie probe); a draft only for
            # rejection sampling
            serves_baseline = role == ("baseline" if cfg.speculative.has_baseline_engine else "target")
            logits_draft = role == "draft" and cfg.speculative.use_draft_logits
            assert ("--gather_generation_logits" in argv) == (serves_baseline or logits_draft), role
            q = p.report.quant  # builder.py: on with FP8 weights + FP8 KV + paged context FMHA on SM >= 89
            fp8_fmha = q.weights == "fp8" and q.kv_cache == "fp8" and p.gpu.has_fp8
            assert arg(argv, "--use_fp8_context_fmha") == ("enable" if fp8_fmha else "disable")
        else:
            if tuple(argv[1:3]) == ("-m", PEAK_MODULE):  # quantize.py under the peak recorder, then as is
                assert argv[3] == "--peak_json" and argv[4].endswith(f"/logs/{s.name}{PEAK_SUFFIX}")
                argv = (argv[0], *argv[5:])
            tool = Path(argv[1]).name
            assert argv[0] == cfg.toolchain.python
            allowed = {"quantize.py": F.QUANTIZE_FLAGS}.get(tool)
            if allowed is None:
                allowed = (
                    F.MEDUSA_CONVERT_FLAGS
                    if "medusa" in argv[1]
                    else (F.EAGLE_CONVERT_FLAGS if "eagle" in argv[1] else F.CONVERT_CHECKPOINT_FLAGS)
                )
            if "--use_fp8" in argv:  # a pre-quantized checkpoint through llama's converter
                allowed = F.PREQUANTIZED_CONVERT_FLAGS
            assert {a for a in argv if a.startswith("--")} <= allowed
            role = s.name.split("-", 1)[1]
            model = cfg.draft if role == "draft" else cfg.target
            assert arg(argv, "--tp_size") == str(model.tp) and arg(argv, "--pp_size") == str(model.pp)
            if tool == "quantize.py":
                assert arg(argv, "--qformat") in F.QUANTIZE_QFORMATS
                if "--kv_cache_dtype" in argv:
                    assert arg(argv, "--kv_cache_dtype") in F.QUANTIZE_KV_DTYPES
    names = [s.name for s in p.steps if s.name not in ("import-target", "distill-draft")]
    assert names.index("checkpoint-target") < names.index("engine-target")
    if cfg.draft is not None:
        assert names == ["checkpoint-target", "checkpoint-draft", "engine-draft", "engine-target"]
    if Mode(cfg.speculative.mode).in_engine:  # the ensemble's non-speculative engine, from the base checkpoint
        assert "engine-baseline" in names and set(p.engines) == {"target", "baseline"}
        base = list(p.step("engine-baseline").argv)
        assert "--speculative_decoding_mode" not in base and "--max_draft_len" not in base
        ckpt = arg(base, "--checkpoint_dir")
        if cfg.speculative.mode in ("medusa", "eagle"):  # their target checkpoint carries the heads
            plain = p.step("checkpoint-baseline").argv
            assert ckpt.endswith("checkpoints/baseline")
            assert not {"--medusa_model_dir", "--eagle_model_dir", "--num_medusa_heads"} & set(plain)
        else:
            assert ckpt == arg(list(p.step("engine-target").argv), "--checkpoint_dir")
    else:
        assert "baseline" not in p.engines


def test_seed_config_is_the_documented_fp8_dtm_recipe():
    seed = REPO / "build_configs" / "llama33-70b-fp8-h100-tp2.yaml"
    p = plan_of(seed)  # NVIDIA's pre-quantized FP8 target: converted, the KV cache as its checkpoint has it
    q = list(p.step("checkpoint-target").argv)
    assert q[1].endswith("models/core/llama/convert_checkpoint.py") and "--use_fp8" in q and arg(q, "--tp_size") == "2"
    t = list(p.step("engine-target").argv)
    assert arg(t, "--speculative_decoding_mode") == "draft_tokens_external" and arg(t, "--max_draft_len") == "5"
    assert arg(t, "--workers") == "2"
    # the BF16 target: quantize.py with FP8 KV, and FP8 context FMHA, what builder.py does with FP8 + FP8 KV anyway
    b = plan_of(seed, ["target.checkpoint=/models/Llama-3.3-70B-Instruct"])
    q = list(b.step("checkpoint-target").argv)
    assert arg(q, "--qformat") == "fp8" and arg(q, "--kv_cache_dtype") == "fp8" and arg(q, "--tp_size") == "2"
    assert arg(list(b.step("engine-target").argv), "--use_fp8_context_fmha") == "enable"
    assert p.report.draft_devices == [0] and p.report.draft_kv_tokens == 8 * 8192
    assert p.report.kv_cache_free_gpu_mem_fraction == 0.85  # GPU 0 keeps the draft's weights + capped KV free


def test_a100_config_falls_back_to_int8_smoothquant():
    p = plan_of(REPO / "build_configs" / "llama31-8b-a100.yaml")
    q = list(p.step("checkpoint-target").argv)
    # SmoothQuant weights, 16-bit KV cache: INT8 KV would turn off the block reuse the DTM target needs
    assert arg(q, "--qformat") == "int8_sq" and "--kv_cache_dtype" not in q
    assert arg(list(p.step("engine-target").argv), "--use_fp8_context_fmha") == "disable"
    assert p.report.quant.fell_back
    # the same file on a Hopper GPU plans FP8
    cfg = load_config(REPO / "build_configs" / "llama31-8b-a100.yaml")
    r = run_preflight(cfg, resolve_gpu(cfg.gpu, "h100:1"), require_checkpoints=False)
    assert r.quant.weights == "fp8"


def test_use_draft_logits_gathers_generation_logits_on_the_draft_too():
    p = plan_of(REPO / "build_configs" / "llama33-70b-fp8-h200.yaml", ["speculative.use_draft_logits=true"])
    assert "--gather_generation_logits" in p.step("engine-draft").argv
    assert "--gather_generation_logits" in p.step("engine-target").argv  # it serves the baseline
    p = plan_of(REPO / "build_configs" / "llama33-70b-fp8-h200.yaml")
    assert "--gather_generation_logits" not in p.step("engine-draft").argv


def test_the_engine_that_serves_the_baseline_gathers_generation_logits():
    """`trt-spec check` reads the baseline engine's next-token logits at a divergence (return_generation_logits), which
    the executor answers only from an engine built with --gather_generation_logits: the target where the BLS runs the
    loop, the baseline engine where the target speculates inside itself (never the speculating engine)."""
    cases = {
        "llama33-70b-fp8-h200.yaml": ("target", ["draft"]),
        "qwen25-coder-32b-ngram-h100.yaml": ("target", []),
        "vicuna-7b-medusa-fp8-h100.yaml": ("baseline", ["target"]),
    }
    for name, (serves, plain) in cases.items():
        p = plan_of(REPO / "build_configs" / name)
        assert "--gather_generation_logits" in p.step(f"engine-{serves}").argv, name
        assert "generation logits (check's near-tie probe)" in p.step(f"engine-{serves}").description
        for role in plain:
            assert "--gather_generation_logits" not in p.step(f"engine-{role}").argv, (name, role)
    for name in ("cpu-smollm2-draft.yaml", "cpu-smollm2-eagle.yaml"):  # the reference engine's export, likewise
        p = plan_of(REPO / "build_configs" / name)
        serves = "baseline" if "eagle" in name else "target"
        for s in p.steps:
            if s.name.startswith("export-"):
                assert ("--gather_generation_logits" in s.argv) == (s.name == f"export-{serves}"), (name, s.name)


def test_bf16_uses_family_convert_checkpoint():
    p = plan_of(
        REPO / "build_configs" / "qwen25-coder-32b-ngram-h100.yaml",
        ["quantization.weights=bf16", "quantization.kv_cache=auto", "limits.max_batch_size=2"],
    )
    argv = list(p.step("checkpoint-target").argv)
    assert argv[1].endswith("models/core/qwen/convert_checkpoint.py") and arg(argv, "--dtype") == "bfloat16"


def test_gemma_convert_uses_its_own_cli(tmp_path):
    from ..conftest import make_checkpoint

    g = make_checkpoint(tmp_path / "gemma", arch="GemmaForCausalLM")
    cfg_path = tmp_path / "g.yaml"
    cfg_path.write_text(
        f"engine: tensorrt\ngpu: h100:2\ntarget: {{checkpoint: {g}, tp: 2}}\n"
        "quantization: {weights: bf16}\nspeculative: {mode: ngram}\n"
        "limits: {max_input_len: 1024, max_seq_len: 2048, max_num_tokens: 2048}\n"
    )
    argv = list(plan_of(cfg_path).step("checkpoint-target").argv)
    assert argv[1].endswith("models/core/gemma/convert_checkpoint.py")
    assert arg(argv, "--ckpt-type") == "hf" and arg(argv, "--model-dir") == str(g)
    assert arg(argv, "--world-size") == "2" and "--output-model-dir" in argv
    assert "--tp_size" not in argv and "--pp_size" not in argv


def test_lookahead_and_eagle_modes(tmp_path):
    base = REPO / "build_configs" / "qwen25-coder-32b-ngram-h100.yaml"
    # a 32B target and its baseline engine do not fit one H100: refused with the knob that drops the baseline
    with pytest.raises(
        PreflightError,
        match=r"baseline weights 32.0 .* drop the baseline engine \(speculative."
        r"baseline_engine: false; check and bench then have no baseline\)",
    ):
        plan_of(base, ["speculative.mode=lookahead", "speculative.max_draft_len=15"])
    p = plan_of(
        base, ["speculative.mode=lookahead", "speculative.max_draft_len=15", "speculative.baseline_engine=false"]
    )
    assert set(p.engines) == {"target"}
    t = list(p.step("engine-target").argv)
    assert arg(t, "--speculative_decoding_mode") == "lookahead_decoding" and arg(t, "--max_draft_len") == "15"
    heads = tmp_path / "eagle"
    p = plan_of(
        base,
        [
            "speculative.mode=eagle",
            "speculative.max_draft_len=63",
            f"speculative.eagle.heads_dir={heads}",
            "quantization.weights=bf16",
            "limits.max_batch_size=2",
            "speculative.baseline_engine=false",
        ],
    )
    c = list(p.step("checkpoint-target").argv)
    assert c[1].endswith("eagle/convert_checkpoint.py") and arg(c, "--eagle_model_dir") == str(heads)
    assert arg(list(p.step("engine-target").argv), "--speculative_decoding_mode") == "eagle"


def test_text_json_and_sh_formats():
    p = plan_of(TRT_CONFIGS[0])
    assert "memory plan per GPU" in p.to_text()
    j = p.to_json()
    assert json.loads(json.dumps(j))["steps"][0]["name"] == "checkpoint-target"
    sh = p.to_sh()
    cmd_lines = [ln for ln in sh.splitlines() if ln and not ln.startswith("#") and not ln.startswith("set ")]
    assert len(cmd_lines) == len(p.steps)  # one logical line per step
    for ln, s in zip(cmd_lines, p.steps):
        assert shlex.split(ln) == list(s.argv)
    subprocess.run(["bash", "-n"], input=sh, text=True, check=True)


def test_sh_script_runs_with_tools(tmp_path, tiny_pair, monkeypatch):
    """The `sh` plan is a runnable script: run it with stand-in tools and check every output appears."""
    tools = write_fake_tools(tmp_path / "tools")
    cfg = {
        "engine": "tensorrt",
        "gpu": "h100:1",
        "target": {"checkpoint": str(tiny_pair[0])},
        "draft": {"checkpoint": str(tiny_pair[1])},
        "toolchain": tools,
        "output_dir": str(tmp_path / "out"),
        "limits": {"max_input_len": 256, "max_seq_len": 512},
    }
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cfg))
    monkeypatch.setenv("FAKE_TOOL_LOG", str(tmp_path / "log.jsonl"))
    p = plan_of(path)
    subprocess.run(["bash", "-c", p.to_sh()], check=True, capture_output=True)
    assert [c["tool"] for c in tool_calls(tmp_path / "log.jsonl")] == [
        "quantize",
        "quantize",
        "trtllm_build",
        "trtllm_build",
    ]
    for d in p.engines.values():
        assert (Path(d) / "config.json").is_file()


def test_python_and_python3_of_one_venv_give_one_fingerprint(tmp_path):
    """`python -m trt_spec.cli build` (make demo) and the `trt-spec` script (python3 in its shebang) must not rebuild
    each other's steps."""
    import os
    import sys

    from trt_spec.builder.plan import _fingerprint

    alias = tmp_path / "python3"
    os.symlink(sys.executable, alias)
    a = _fingerprint((sys.executable, "-m", "x"), {}, [])
    assert a == _fingerprint((str(alias), "-m", "x"), {}, [])
    assert a != _fingerprint(("/usr/bin/env", "-m", "x"), {}, [])
