"""Pre-quantized ModelOpt FP8 checkpoints on the engine path (issue 44 item 2): detected from hf_quant_config.json or
config.json's quantization_config, converted by llama's convert_checkpoint.py --use_fp8 with no calibration, and
refused in one line where the config asks for something the checkpoint does not carry; quantize.py's peak recorder."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from trt_spec.builder.plan import make_plan
from trt_spec.builder.prequant import read_prequant
from trt_spec.builder.quantize_peak import PEAK_MODULE

from ..conftest import REPO, make_checkpoint
from .test_preflight import cfg_for, one_line, preflight

LINEARS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
           "mlp.up_proj", "mlp.down_proj")  # fmt: skip


def modelopt_fp8(d: Path, *, kv_fp8: bool, layers: int = 2, hidden: int = 64, in_config: bool = False) -> Path:
    """A tiny checkpoint as ModelOpt's FP8 Hugging Face export writes it: float8_e4m3fn linear weights with float32
    weight_scale and input_scale, k/v scales with an FP8 KV cache, hf_quant_config.json (or, in_config, config.json's
    quantization_config)."""
    import torch
    from safetensors.torch import save_file

    make_checkpoint(d, layers=layers, hidden=hidden)
    cfg = json.loads((d / "config.json").read_text())
    h, ffn, kv = hidden, cfg["intermediate_size"], hidden // 4 * 2
    shapes = {"q_proj": (h, h), "k_proj": (kv, h), "v_proj": (kv, h), "o_proj": (h, h), "gate_proj": (ffn, h),
              "up_proj": (ffn, h), "down_proj": (h, ffn)}  # fmt: skip
    t = {"model.embed_tokens.weight": torch.randn(cfg["vocab_size"], h, dtype=torch.bfloat16)}
    for i in range(layers):
        for lin in LINEARS:
            p = f"model.layers.{i}.{lin}"
            w = torch.randn(*shapes[lin.split(".")[1]])
            scale = w.abs().max() / 448.0  # e4m3's largest finite value
            t[f"{p}.weight"] = (w / scale).to(torch.float8_e4m3fn)
            t[f"{p}.weight_scale"] = scale.float()
            t[f"{p}.input_scale"] = torch.tensor(0.02)
        if kv_fp8:
            t[f"model.layers.{i}.self_attn.k_proj.k_scale"] = torch.tensor(0.01)
            t[f"model.layers.{i}.self_attn.v_proj.v_scale"] = torch.tensor(0.01)
    save_file(t, str(d / "model.safetensors"))
    quant = {"quant_algo": "FP8", "kv_cache_quant_algo": "FP8" if kv_fp8 else None, "exclude_modules": ["lm_head"]}
    if in_config:
        cfg["quantization_config"] = {"quant_method": "modelopt", **quant}
        (d / "config.json").write_text(json.dumps(cfg))
    else:
        producer = {"name": "modelopt", "version": "0.21.0"}
        (d / "hf_quant_config.json").write_text(json.dumps({"producer": producer, "quantization": quant}))
    return d


def test_detection_reads_modelopts_files(tmp_path):
    p = read_prequant(modelopt_fp8(tmp_path / "a", kv_fp8=True))
    assert (p.quant_algo, p.kv_cache_quant_algo, p.source) == ("FP8", "FP8", "hf_quant_config.json")
    p = read_prequant(modelopt_fp8(tmp_path / "b", kv_fp8=False, in_config=True))
    assert (p.quant_algo, p.kv_cache_quant_algo, p.source) == ("FP8", None, "config.json quantization_config")
    assert read_prequant(make_checkpoint(tmp_path / "bf16")) is None


def test_the_plan_converts_a_prequantized_target_and_calibrates_only_the_bf16_draft(tmp_path):
    target = modelopt_fp8(tmp_path / "t", kv_fp8=True, layers=4, hidden=128)
    draft = make_checkpoint(tmp_path / "d", layers=2, hidden=64)
    r = preflight(cfg_for(tmp_path, target, draft))
    assert (r.quant.weights, r.quant.kv_cache) == ("fp8", "fp8") and set(r.prequantized) == {"target"}
    plan = make_plan(r.config, r, tmp_path / "c.yaml")
    argv = plan.step("checkpoint-target").argv
    assert argv[1].endswith("examples/models/core/llama/convert_checkpoint.py")
    assert argv[-2:] == ("--use_fp8", "--fp8_kv_cache") and "--qformat" not in argv and "--calib_size" not in argv
    draft_argv = plan.step("checkpoint-draft").argv
    assert draft_argv[1:3] == ("-m", PEAK_MODULE) and draft_argv[5].endswith("quantization/quantize.py")
    assert r.calibration is not None  # the draft's
    # the checkpoint's KV cache without k/v scales: auto follows it (16-bit); the converter gets no --fp8_kv_cache
    plain = modelopt_fp8(tmp_path / "t16", kv_fp8=False, layers=4, hidden=128)
    r = preflight(cfg_for(tmp_path, plain, draft))
    assert r.quant.kv_cache == "none"
    assert "--fp8_kv_cache" not in make_plan(r.config, r, tmp_path / "c.yaml").step("checkpoint-target").argv


def test_the_config_must_agree_with_the_checkpoint(tmp_path):
    target = modelopt_fp8(tmp_path / "t", kv_fp8=False, layers=4, hidden=128)
    draft = make_checkpoint(tmp_path / "d", layers=2, hidden=64)
    with pytest.raises(Exception) as e:
        preflight(cfg_for(tmp_path, target, draft, quantization={"weights": "int4_awq"}))
    msg = one_line(e)
    assert "is pre-quantized FP8 (hf_quant_config.json), but quantization.weights is int4_awq" in msg
    assert "set quantization.weights: fp8" in msg
    with pytest.raises(Exception) as e:
        preflight(cfg_for(tmp_path, target, draft, quantization={"kv_cache": "fp8"}))
    assert "kv_cache_quant_algo null (no k/v scales), but quantization.kv_cache is fp8" in one_line(e)
    assert "scale 1.0" in one_line(e) and "set quantization.kv_cache: auto" in one_line(e)
    with pytest.raises(Exception) as e:
        preflight(cfg_for(tmp_path, target, draft, quantization={"fallback": "int8_sq"}), gpu="a100-80gb:1")
    assert "but quantization.weights is fp8 on a GPU without FP8" in one_line(e)


def test_the_shipped_70b_configs_plan_without_calibrating_the_70b():
    from click.testing import CliRunner

    from trt_spec.cli import main

    for config, gpu in (("llama33-70b-fp8-h100-tp2", "h100:2"), ("llama33-70b-fp8-h200", "h200")):
        r = CliRunner().invoke(main, ["plan", str(REPO / "build_configs" / f"{config}.yaml"), "--gpu", gpu])
        assert r.exit_code == 0, r.output
        assert "convert_checkpoint.py --model_dir /models/Llama-3.3-70B-Instruct-FP8" in r.output
        assert "--use_fp8" in r.output and "refused" not in r.output and "quantizing the target" not in r.output
        assert "--model_dir /models/Llama-3.2-1B-Instruct" in r.output  # the draft is calibrated (small)


def test_the_peak_recorder_runs_the_script_and_writes_its_peak(tmp_path):
    script = tmp_path / "quantize.py"
    script.write_text("import sys\nprint('args', sys.argv[1:])\nsys.exit(3 if '--fail' in sys.argv else 0)\n")
    peak = tmp_path / "logs" / "checkpoint-draft.quantize-peak.json"
    run = lambda *a: subprocess.run(  # noqa: E731
        [sys.executable, "-m", PEAK_MODULE, "--peak_json", str(peak), str(script), *a], capture_output=True, text=True
    )
    p = run("--model_dir", "x")
    assert p.returncode == 0 and "args ['--model_dir', 'x']" in p.stdout
    got = json.loads(peak.read_text())
    assert got["exit_code"] == 0 and got["cuda"] is False and got["max_memory_allocated_gib"] == 0.0
    p = run("--fail")
    assert p.returncode == 3 and json.loads(peak.read_text())["exit_code"] == 3
