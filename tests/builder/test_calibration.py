"""Calibration that fits the host and works offline (issue 30 item 6): a quantization whose peak exceeds the GPUs is
refused unless --allow-offload; quantization.calib_dataset is checked as quantize.py reads it (get_calib_dataloader:
a directory, load_dataset(DIR, split="train")["text"]) before anything runs; the bundled set ships in the wheel."""

import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from trt_spec.builder import calibration as cal
from trt_spec.builder.hardware import named_gpu
from trt_spec.builder.plan import make_plan
from trt_spec.builder.preflight import PreflightError, run_preflight
from trt_spec.cli import main
from trt_spec.records.config import load_config

from ..conftest import REPO

H100_TP2 = REPO / "build_configs" / "llama33-70b-fp8-h100-tp2.yaml"
H200 = REPO / "build_configs" / "llama33-70b-fp8-h200.yaml"
BF16_70B = ("target.checkpoint=/models/Llama-3.3-70B-Instruct",)  # the shipped configs' target is pre-quantized
# the FP8 70B serves from one H100 at batch 1 x 4096 tokens, which its BF16 calibration does not fit
ONE_H100 = (
    "limits.max_batch_size=1",
    "limits.max_seq_len=4096",
    "limits.max_num_tokens=4096",
    "limits.max_input_len=2048",
)


def preflight(path=H100_TP2, sets=(), gpu="h100:2", bf16=True, **kw):
    """The 70B configs with their BF16 target (bf16), which quantize.py calibrates."""
    sets = (*BF16_70B, *sets) if bf16 else tuple(sets)
    return run_preflight(load_config(path, sets), named_gpu(gpu), require_checkpoints=False, **kw)


def refusal(e) -> str:
    msg = str(e.value)
    assert "\n" not in msg
    return msg


# --- the calibration peak against the GPUs ------------------------------------------------------------------------


def test_a_calibration_whose_weights_exceed_the_gpus_is_refused_unless_offload_is_allowed():
    """The floor: 16-bit weights (70.6B x 2 bytes = 131 GiB) + one calibration batch, derived in records/memory.py."""
    with pytest.raises(PreflightError) as e:
        preflight(H200, ONE_H100, gpu="h100:1", allow_offload=False)
    msg = refusal(e)
    assert msg.startswith(
        "quantizing the target to fp8 (quantize.py) holds at least ~132 GiB (16-bit weights 131 + one calibration "
        "batch), more than the 80 GiB of 1x h100"
    )
    assert ">= 2x h100" in msg and "--gpu h100:2" in msg and "pre-quantized FP8" in msg and "--allow-offload" in msg
    r = preflight(H200, ONE_H100, gpu="h100:1", allow_offload=True)
    assert any("--allow-offload: accelerate offloads the rest to host memory" in w for w in r.warnings)
    r = preflight(H200, ONE_H100, gpu="h100:1")  # a caller that builds nothing (repository, deploy): only a warning
    assert any("refused there without --allow-offload" in w for w in r.warnings)


def test_the_bf16_70b_calibrates_on_the_hosts_the_configs_name_and_warns_in_the_band():
    """2x H100 (159 GiB) and 1x H200 (140 GiB) hold the ceiling (weights + batch + each GPU's context and largest
    module); a longer calibration sequence on the H200 lands between floor and ceiling: a warning, not a refusal."""
    for path, gpu in ((H100_TP2, "h100:2"), (H200, "h200:1")):
        r = preflight(path, gpu=gpu, allow_offload=False)
        assert r.calibration is not None and not any("quantizing the target" in w for w in r.warnings)
    r = preflight(H200, ("quantization.calib_max_seq_length=3072",), gpu="h200:1", allow_offload=False)
    (w,) = [w for w in r.warnings if "quantizing the target" in w]
    assert "holds ~139 GiB" in w and "up to ~142 GiB" in w and "may offload" in w and "quantize-peak.json" in w
    with pytest.raises(PreflightError, match=r"more than the 140 GiB of 1x h200"):
        preflight(H200, ("quantization.calib_max_seq_length=4096",), gpu="h200:1", allow_offload=False)


def test_the_build_counts_the_gpus_of_its_host():
    """quantize.py sees every GPU of the host: a build node with more GPUs than the serving plan calibrates there."""
    r = preflight(H200, gpu="h200:1", allow_offload=False, calibration_gpu=named_gpu("h100:2"))
    assert not any("quantizing the target" in w for w in r.warnings)
    with pytest.raises(PreflightError, match=r"more than the 80 GiB of 1x h100"):
        preflight(H200, gpu="h200:1", allow_offload=False, calibration_gpu=named_gpu("h100:1"))


def test_no_refusal_where_nothing_is_quantized():
    qwen = REPO / "build_configs" / "qwen25-coder-32b-ngram-h100.yaml"  # FP8: ~62 GiB to quantize on one H100
    preflight(qwen, gpu="h100:1", bf16=False, allow_offload=False)
    small = [
        "limits.max_batch_size=1",
        "limits.max_seq_len=4096",
        "limits.max_num_tokens=4096",
        "limits.max_input_len=2048",
    ]
    r = preflight(
        qwen,
        ["quantization.weights=bf16", "quantization.kv_cache=auto", *small],
        gpu="h100:1",
        bf16=False,
        allow_offload=False,
    )  # BF16: convert_checkpoint.py, nothing loaded to quantize
    assert r.calibration is None and not any("quantizing" in w for w in r.warnings)
    # the shipped 70B configs: the target is pre-quantized, only the 1B draft is calibrated
    r = preflight(H100_TP2, gpu="h100:2", bf16=False, allow_offload=False)
    assert set(r.prequantized) == {"target"} and r.calibration is not None
    llmapi = REPO / "build_configs" / "llama33-70b-eagle3-h200.yaml"  # the LLM API quantizes nothing
    run_preflight(load_config(llmapi), named_gpu("h200:1"), require_checkpoints=False, allow_offload=False)


def test_build_refuses_in_one_line_plan_warns_and_both_take_allow_offload():
    over = ["--gpu", "h100:1", *(a for s in (*BF16_70B, *ONE_H100) for a in ("--set", s))]
    r = CliRunner().invoke(main, ["build", str(H200), "--dry-run", *over])
    assert r.exit_code == 2
    assert re.fullmatch(r"error: quantizing the target .*--allow-offload.*\n", r.output), r.output
    r = CliRunner().invoke(main, ["plan", str(H200), *over])  # a plan builds nothing: it says what build refuses
    assert r.exit_code == 0 and "the build is refused there without --allow-offload" in r.output, r.output
    r = CliRunner().invoke(main, ["plan", str(H200), "--allow-offload", *over])
    assert r.exit_code == 0 and "warning: quantizing the target to fp8" in r.output
    assert "--allow-offload" in CliRunner().invoke(main, ["build", "--help"]).output


# --- the calibration set ------------------------------------------------------------------------------------------


def check(path, calib_size=512, require=True):
    return cal.check_calib_dataset(str(path), calib_size, 512, require=require)


def jsonl(d: Path, name: str, rows) -> Path:
    f = d / name
    f.parent.mkdir(parents=True, exist_ok=True)
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return f


def test_the_bundled_set_is_what_quantize_py_reads_offline():
    d = cal.resolve(cal.BUNDLED_CALIB_DATASET)
    assert sorted(p.name for p in d.iterdir()) == ["train.jsonl"]  # one format, the train split: nothing to infer
    rows = [json.loads(line) for line in (d / "train.jsonl").read_text().splitlines()]
    assert len(rows) >= 256 and all(set(r) == {"text"} and r["text"].strip() for r in rows)
    assert len({r["text"] for r in rows}) == len(rows)
    c = check(cal.BUNDLED_CALIB_DATASET)
    assert c.samples == len(rows) and c.files == ("train.jsonl",) and c.path == str(d)
    assert check(cal.BUNDLED_CALIB_DATASET, calib_size=64).samples == 64
    assert not any(w in str(d) for w in ("cnn_dailymail", "scienceqa", "science_qa"))  # quantize.py's name branches
    # configs written before the build stage's folder was renamed (build/ -> builder/) still find it
    assert cal.resolve("pkg:trt_spec/build/calib_sets/trt-spec-mixed-v1") == d
    # shipped in the wheel: pyproject's package-data globs it
    assert '"trt_spec.builder" = ["calib_sets/*/*.jsonl"]' in (REPO / "pyproject.toml").read_text()
    try:  # Hugging Face datasets, as quantize.py calls it, where it imports
        from datasets import load_dataset
    except ImportError:
        return
    assert load_dataset(str(d), split="train")["text"][:3] == [r["text"] for r in rows[:3]]


def test_a_local_directory_in_the_layout_load_dataset_reads(tmp_path):
    jsonl(tmp_path / "set", "train.jsonl", [{"text": f"t{i}", "id": i} for i in range(5)])
    jsonl(tmp_path / "set", "test.jsonl", [{"text": "held out"}])  # another split: not counted
    c = check(tmp_path / "set")
    assert c.samples == 5 and c.files == ("train.jsonl",)
    jsonl(tmp_path / "plain", "texts.jsonl", [{"text": "a"}, {"text": "b"}])  # no split named: all is train
    assert check(tmp_path / "plain").samples == 2
    (tmp_path / "csv").mkdir()
    (tmp_path / "csv" / "train.csv").write_text("id,text\n1,hello\n2,world\n")
    assert check(tmp_path / "csv").samples == 2
    (tmp_path / "txt").mkdir()
    (tmp_path / "txt" / "data.txt").write_text("one\ntwo\nthree\n")
    assert check(tmp_path / "txt").samples == 3
    (tmp_path / "pq").mkdir()
    (tmp_path / "pq" / "train-00000.parquet").write_bytes(b"PAR1" + b"\0" * 32 + b"schema text" + b"PAR1")
    assert check(tmp_path / "pq").samples is None  # parquet rows are not counted without pyarrow


@pytest.mark.parametrize(
    "layout, expect",
    [
        ("file", r"a file; quantize.py takes a directory .*move it into a directory as train.jsonl"),
        ("missing", r"directory not found .*bundled pkg:trt_spec/builder/calib_sets/trt-spec-mixed-v1"),
        (
            "saved",
            r"a Dataset.save_to_disk folder, which quantize.py's datasets.load_dataset does not read; write it as "
            r"DIR/train.jsonl",
        ),
        ("no_text", r"train.jsonl row 2 has no \"text\"; quantize.py tokenizes each row's \"text\" column"),
        ("not_str", r"train.jsonl row 1 has a int"),
        ("not_json", r"train.jsonl line 1 is not JSON"),
        ("csv_column", r"train.csv has no \"text\" column \(columns: id, body\)"),
        ("only_test", r"its files name splits but none is a train split"),
        ("mixed", r"its train split mixes csv and json files"),
        ("empty", r"no data files"),
        ("cnn", r"a path containing 'cnn_dailymail' as the cnn_dailymail dataset \(config 3.0.0, column article\)"),
        ("scienceqa", r"pileval/scienceqa"),
    ],
)
def test_a_calibration_set_quantize_py_cannot_read_is_refused_in_one_line(tmp_path, layout, expect):
    d = tmp_path / ("my_cnn_dailymail" if layout == "cnn" else "scienceqa_copy" if layout == "scienceqa" else "set")
    if layout == "file":
        jsonl(tmp_path, "set.jsonl", [{"text": "a"}])
        d = tmp_path / "set.jsonl"
    elif layout == "saved":
        d.mkdir()
        (d / "data-00000-of-00001.arrow").write_bytes(b"x")
        (d / "state.json").write_text("{}")
    elif layout == "no_text":
        jsonl(d, "train.jsonl", [{"text": "a"}, {"body": "b"}])
    elif layout == "not_str":
        jsonl(d, "train.jsonl", [{"text": 3}])
    elif layout == "not_json":
        d.mkdir()
        (d / "train.jsonl").write_text("text: hello\n")
    elif layout == "csv_column":
        d.mkdir()
        (d / "train.csv").write_text("id,body\n1,x\n")
    elif layout == "only_test":
        jsonl(d, "test.jsonl", [{"text": "a"}])
    elif layout == "mixed":
        jsonl(d, "train.jsonl", [{"text": "a"}])
        (d / "train.csv").write_text("text\nb\n")
    elif layout in ("empty", "cnn"):
        d.mkdir()
        (d / "README.md").write_text("no data here\n")
    elif layout == "scienceqa":
        jsonl(d, "train.jsonl", [{"text": "a"}])
    with pytest.raises(PreflightError) as e:
        check(d)
    assert re.search(expect, refusal(e)), refusal(e)
    assert refusal(e).startswith(f"quantization.calib_dataset {d}")


def test_a_local_cnn_dailymail_copy_with_its_config_passes(tmp_path):
    d = tmp_path / "cnn_dailymail"
    (d / "3.0.0").mkdir(parents=True)
    (d / "3.0.0" / "train-00000-of-00003.parquet").write_bytes(b"PAR1PAR1")
    assert check(d).path == str(d)


def test_preflight_checks_the_set_and_the_plan_passes_the_directory(tmp_path):
    """Before anything expensive: a build refuses a missing directory; the plan passes the resolved, absolute directory
    (pkg: included) to quantize.py and names the set in a note; plan on another machine leaves a path unchecked."""
    sets = [f"quantization.calib_dataset={cal.BUNDLED_CALIB_DATASET}", "quantization.calib_size=64"]
    r = preflight(sets=sets, gpu="h100:4", allow_offload=False)
    assert r.calibration.samples == 64 and r.calibration.path == str(cal.resolve(cal.BUNDLED_CALIB_DATASET))
    assert any(n.startswith(f"calibration set: {cal.BUNDLED_CALIB_DATASET} at ") for n in r.notes)
    plan = make_plan(r.config, r, H100_TP2)
    argv = plan.step("checkpoint-target").argv
    assert argv[argv.index("--calib_dataset") + 1] == r.calibration.path
    assert r.calibration.path in plan.step("checkpoint-target").inputs
    default = preflight(gpu="h100:4")
    assert "--calib_dataset" not in make_plan(default.config, default, H100_TP2).step("checkpoint-target").argv
    assert any("downloaded from the Hugging Face Hub" in n and cal.BUNDLED_CALIB_DATASET in n for n in default.notes)
    absent = ["quantization.calib_dataset=/nowhere/calib"]
    assert preflight(sets=absent, gpu="h100:4").calibration.samples is None  # plan: checked by build
    r = preflight(
        sets=["quantization.weights=bf16", "quantization.kv_cache=auto", "quantization.calib_dataset=/nowhere"],
        gpu="h200:4",
    )
    assert r.calibration is None and any("calib_dataset is not used" in n for n in r.notes)
    with pytest.raises(PreflightError, match=r"no installed package 'no_such_pkg'"):
        preflight(sets=["quantization.calib_dataset=pkg:no_such_pkg/x"], gpu="h100:4")


def test_the_fingerprint_follows_the_content(tmp_path):
    jsonl(tmp_path / "a", "train.jsonl", [{"text": "x"}])
    f1 = cal.fingerprint(str(tmp_path / "a"))
    jsonl(tmp_path / "a", "train.jsonl", [{"text": "y"}])
    assert f1 != cal.fingerprint(str(tmp_path / "a")) and f1.startswith("sha256:")
    assert cal.fingerprint(None) is None and cal.fingerprint(str(tmp_path / "missing")) is None
