"""`make image-twin`: the GPU smoke chain's CPU links, in a venv holding the NGC 26.04 image's package versions.

Run with the twin venv's python from the repository root (the Makefile does). One line per link, PASS / FAIL /
SKIP(reason); exit 1 on any FAIL. Links (build/image-twin/logs/LINK.log each):
  pins            the installed versions meet tools/image-twin.txt (and Python is the image's 3.12)
  import-target   the GGUF import step, argv as the GPU plan writes it (trt_spec.reference.checkpoints, bfloat16)
  distill-draft   the draft distillation step as the GPU plan writes it, with fewer steps and teacher samples
  quantize-*      what quantize.py does with ModelOpt: mtq.quantize(FP8_DEFAULT_CFG + FP8 KV) calibrated on the
                  bundled set read by datasets.load_dataset, then export_tensorrt_llm_checkpoint (tp1 pp1)
  checkpoint-*    the written checkpoint against what TensorRT-LLM 1.2.1 loads (config.json keys, rank0.safetensors
                  names and dtypes; upstream-facts: trtllm-checkpoint-format)
  served-imports  every import of the served python models (as `trt-spec doctor` checks them)
  check, bench    `trt-spec check` / `bench served` from this venv against the CPU stand-in repository the demo
                  builds, served by .venv's `trt-spec serve` (pytriton's tritonserver is not in the image's set)
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # trt_spec from this checkout whatever the cwd

PINS = ROOT / "tools" / "image-twin.txt"
ENGINE_CONFIG = "build_configs/smollm2-first-contact-fp8.yaml"
STANDIN_CONFIG = "build_configs/cpu-smollm2-ngram.yaml"  # the quickstart's: make slow has built it in CI
OUT = ROOT / "build" / "image-twin"
IMAGE_PYTHON = (3, 12)  # upstream-facts: ngc-image-26-04
MAIN_VENV = ROOT / ".venv"
# quantize.py's FP8 KV config name per --kv_cache_dtype (upstream-facts: image-twin-quantize-calls)
KV_CFG = {"fp8": "FP8_KV_CFG"}


# ------------------------------------------------------------------------------------------------------------ pins


def pin_lines(text: str) -> list[tuple[str, str]]:
    """(distribution, specifier) per requirement line of the pin file; extras dropped."""
    out = []
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        m = re.match(r"^([A-Za-z0-9][A-Za-z0-9_.-]*)(\[[^\]]*\])?\s*(.*)$", line)
        if m:
            out.append((m.group(1), m.group(3).strip()))
    return out


def check_pins() -> str:
    from importlib import metadata

    from packaging.specifiers import SpecifierSet

    bad, got = [], []
    if sys.version_info[:2] != IMAGE_PYTHON:
        bad.append(f"python {sys.version.split()[0]} (the image has {IMAGE_PYTHON[0]}.{IMAGE_PYTHON[1]})")
    for dist, spec in pin_lines(PINS.read_text()):
        try:
            v = metadata.version(dist)
        except metadata.PackageNotFoundError:
            bad.append(f"{dist} not installed")
            continue
        got.append(f"{dist} {v}")
        if spec and v not in SpecifierSet(spec, prereleases=True):
            bad.append(f"{dist} {v} not {spec}")
    if bad:
        raise SystemExit("; ".join(bad) + f" (reinstall: rm -rf {Path(sys.prefix).name} && make image-twin)")
    return f"python {sys.version.split()[0]}, " + ", ".join(got)


# -------------------------------------------------------------------------------------------------------- quantize


def quantize_export(hf_dir: str, out_dir: str, calib_dir: str, calib_size: int, seq_len: int) -> str:
    """quantize.py --qformat fp8 --kv_cache_dtype fp8 --dtype bfloat16 --tp_size 1 --pp_size 1 on CPU, through the
    same ModelOpt calls TensorRT-LLM 1.2.1's quantize_by_modelopt makes (its own wrapper refuses without a GPU)."""
    import copy

    import modelopt.torch.quantization as mtq
    import torch
    from datasets import load_dataset
    from modelopt.torch.export import export_tensorrt_llm_checkpoint
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.bfloat16).eval()
    tok = AutoTokenizer.from_pretrained(hf_dir)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    # get_calib_dataloader's directory branch (upstream-facts: quantize-calib-dataset-branches)
    texts = load_dataset(calib_dir, split="train")["text"][:calib_size]
    cfg = copy.deepcopy(mtq.FP8_DEFAULT_CFG)
    cfg["quant_cfg"].update(getattr(mtq, KV_CFG["fp8"])["quant_cfg"])

    def calibrate() -> None:
        with torch.no_grad():
            for t in texts:  # --batch_size 1
                ids = tok(t, return_tensors="pt", truncation=True, max_length=seq_len)["input_ids"]
                model(input_ids=ids)

    mtq.quantize(model, cfg, forward_loop=calibrate)
    with torch.inference_mode():
        export_tensorrt_llm_checkpoint(
            model,
            "llama",
            torch.bfloat16,
            export_dir=out_dir,
            inference_tensor_parallel=1,
            inference_pipeline_parallel=1,
        )
    return f"{len(texts)} calibration rows, exported to {out_dir}"


# ------------------------------------------------------------------------------------------------------ checkpoint

# TensorRT-LLM's checkpoint format (upstream-facts: trtllm-checkpoint-format): mandatory config.json fields
CONFIG_KEYS = ("architecture", "dtype", "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
               "hidden_act")  # fmt: skip
FP8_LINEARS = ("attention.qkv", "attention.dense", "mlp.fc", "mlp.gate", "mlp.proj")  # LLaMA's GatedMLP: fc, gate, proj


def check_checkpoint(ckpt: str, hf_dir: str) -> str:
    """config.json and rank0.safetensors as trtllm-build reads a LlamaForCausalLM FP8 + FP8-KV checkpoint."""
    from safetensors import safe_open

    d = Path(ckpt)
    cfg = json.loads((d / "config.json").read_text())
    hf = json.loads((Path(hf_dir) / "config.json").read_text())
    bad = [f"config.json lacks {k}" for k in CONFIG_KEYS if k not in cfg]
    want = {
        "architecture": "LlamaForCausalLM",
        "dtype": "bfloat16",
        "num_hidden_layers": hf["num_hidden_layers"],
        "hidden_size": hf["hidden_size"],
        "vocab_size": hf["vocab_size"],
    }
    bad += [f"config.json {k} is {cfg.get(k)!r}, not {v!r}" for k, v in want.items() if cfg.get(k) != v]
    q, m = cfg.get("quantization") or {}, cfg.get("mapping") or {}
    if q.get("quant_algo") != "FP8" or q.get("kv_cache_quant_algo") != "FP8":
        bad.append(f"config.json quantization is {q}, not quant_algo FP8 + kv_cache_quant_algo FP8")
    if m.get("world_size", 1) != 1 or m.get("tp_size", 1) != 1 or m.get("pp_size", 1) != 1:
        bad.append(f"config.json mapping is {m}, not one rank")
    ranks = sorted(p.name for p in d.glob("rank*.safetensors"))
    if ranks != ["rank0.safetensors"]:
        raise SystemExit("; ".join(bad + [f"rank files {ranks}, not [rank0.safetensors]"]))
    with safe_open(str(d / "rank0.safetensors"), "pt") as f:
        dtypes = {k: f.get_slice(k).get_dtype() for k in f.keys()}
    need = {"transformer.vocab_embedding.weight": "BF16", "transformer.ln_f.weight": "BF16"}
    if "lm_head.weight" in dtypes or not cfg.get("share_embedding_table", False):
        need["lm_head.weight"] = "BF16"  # quantize.py leaves lm_head unquantized (FP8_DEFAULT_CFG's *lm_head*)
    for i in range(hf["num_hidden_layers"]):
        p = f"transformer.layers.{i}."
        need[p + "input_layernorm.weight"] = "BF16"
        need[p + "post_layernorm.weight"] = "BF16"
        need[p + "attention.kv_cache_scaling_factor"] = "F32"
        for lin in FP8_LINEARS:
            need[p + lin + ".weight"] = "F8_E4M3"
            need[p + lin + ".weights_scaling_factor"] = "F32"
            need[p + lin + ".activation_scaling_factor"] = "F32"
    heads, kv = hf["num_attention_heads"], hf.get("num_key_value_heads", hf["num_attention_heads"])
    qkv_rows = (heads + 2 * kv) * (hf["hidden_size"] // heads)  # fused q, k, v: (out_features, in_features)
    with safe_open(str(d / "rank0.safetensors"), "pt") as f:
        shape = (
            f.get_slice("transformer.layers.0.attention.qkv.weight").get_shape() if need.keys() <= dtypes.keys() else []
        )
    if shape and list(shape) != [qkv_rows, hf["hidden_size"]]:
        bad.append(f"layer 0 qkv.weight is {shape}, not [{qkv_rows}, {hf['hidden_size']}]")
    missing = [k for k in need if k not in dtypes]
    wrong = [f"{k} is {dtypes[k]}, not {v}" for k, v in need.items() if k in dtypes and dtypes[k] != v]
    bad += [f"rank0.safetensors lacks {len(missing)} tensor(s), e.g. {', '.join(missing[:3])}"] if missing else []
    bad += wrong[:5]
    if bad:
        raise SystemExit("; ".join(bad))
    return f"{len(dtypes)} tensors, {len(need)} checked; quantization {q}"


# --------------------------------------------------------------------------------------------------------- imports


def check_served_imports() -> str:
    from trt_spec.doctor import served_import_checks

    checks = served_import_checks()
    bad = [f"{c.name}: {c.detail}" for c in checks if not c.ok]
    if bad:
        raise SystemExit("; ".join(bad))
    return checks[0].detail


# ----------------------------------------------------------------------------------------------------------- driver


class Runner:
    def __init__(self, logs: Path) -> None:
        self.logs = logs
        self.results: list[tuple[str, str]] = []  # (link, status)
        logs.mkdir(parents=True, exist_ok=True)

    def status(self, name: str) -> str:
        return dict(self.results).get(name, "")

    def skip(self, name: str, reason: str) -> None:
        self.results.append((name, "SKIP"))
        print(f"SKIP {name} ({reason})", flush=True)

    def run(self, name: str, argv: list[str], needs: tuple[str, ...] = (), timeout_s: float = 1800.0) -> bool:
        """One link as a subprocess; PASS/FAIL on its exit code, its last line as the detail."""
        failed = [n for n in needs if self.status(n) != "PASS"]
        if failed:
            self.skip(name, f"needs {', '.join(failed)}")
            return False
        log = self.logs / f"{name}.log"
        t0 = time.monotonic()
        with open(log, "w") as f:
            f.write(f"$ {shlex.join(argv)}\n")
            f.flush()
            try:
                rc = subprocess.run(argv, stdout=f, stderr=subprocess.STDOUT, cwd=ROOT, timeout=timeout_s).returncode
            except subprocess.TimeoutExpired:
                rc = f"timed out after {timeout_s:.0f}s"
        secs = time.monotonic() - t0
        lines = [ln for ln in log.read_text(errors="replace").splitlines()[1:] if ln.strip()]
        last = lines[-1][:300] if lines else ""
        ok = rc == 0
        self.results.append((name, "PASS" if ok else "FAIL"))
        if ok:
            print(f"PASS {name} ({secs:.0f}s): {last}", flush=True)
        else:
            print(f"FAIL {name} ({secs:.0f}s, exit {rc}; log {log.relative_to(ROOT)}): {last}", flush=True)
        return ok


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def self_argv(*args: str) -> list[str]:
    return [sys.executable, str(Path(__file__).resolve()), *args]


def build_links(r: Runner) -> None:
    """import-target -> distill-draft -> quantize + checkpoint check per role, the GPU plan's own step argvs."""
    from trt_spec.builder.calibration import resolve
    from trt_spec.builder.plan import GPU_SOURCE_DTYPE, _source_steps
    from trt_spec.records.config import load_config

    cfg = load_config(ROOT / ENGINE_CONFIG, [f"draft.distill.steps={os.environ.get('TWIN_DISTILL_STEPS', '100')}"])
    steps, hf = _source_steps(cfg, OUT, GPU_SOURCE_DTYPE)
    prev: tuple[str, ...] = ()
    for st in steps:  # import-target, distill-draft; sys.executable is this venv's python
        argv = list(st.argv)
        if st.name.startswith("distill"):  # the code under the image's versions, not the draft's quality: most of
            argv += ["--chat_prompts", "2", "--teacher_chunks", "16"]  # the time was the bf16 teacher generating
        r.run(st.name, argv, needs=prev)
        prev = (st.name,)
    q = cfg.quantization
    calib = str(resolve(q.calib_dataset))
    for role in ("target", "draft"):
        ckpt = str(OUT / "checkpoints" / role)
        qa = [hf[role], ckpt, calib, str(q.calib_size), str(q.calib_max_seq_length)]
        r.run(
            f"quantize-{role}", self_argv("quantize", *qa), needs=("import-target",) + (prev if role == "draft" else ())
        )
        r.run(f"checkpoint-{role}", self_argv("checkpoint", ckpt, hf[role]), needs=(f"quantize-{role}",))


def client_links(r: Runner) -> None:
    """The stand-in repository (built and served by .venv, as make demo does), then check and bench from here."""
    main_cli = [str(MAIN_VENV / "bin" / "python"), "-m", "trt_spec.cli"]
    twin_cli = [sys.executable, "-m", "trt_spec.cli"]
    if not (MAIN_VENV / "bin" / "python").exists():
        for name in ("standin-build", "standin-repo", "check", "bench"):
            r.skip(name, f"no {MAIN_VENV.name}: make setup builds and serves the stand-in")
        return
    from trt_spec.gpu_smoke import _stop, http_ready

    build_dir = ROOT / "build" / Path(STANDIN_CONFIG).stem
    repo = OUT / "standin-repo"
    r.run("standin-build", main_cli + ["build", STANDIN_CONFIG])
    r.run("standin-repo", main_cli + ["repo", str(build_dir), "--out", str(repo)], needs=("standin-build",))
    if r.status("standin-repo") != "PASS":
        for name in ("check", "bench"):
            r.skip(name, "needs standin-repo")
        return
    http, grpc, metrics = free_port(), free_port(), free_port()
    log = r.logs / "serve.log"
    argv = main_cli + ["serve", str(repo), "--http-port", str(http), "--grpc-port", str(grpc)]
    argv += ["--metrics-port", str(metrics)]
    with open(log, "w") as f:
        f.write(f"$ {shlex.join(argv)}\n")
        f.flush()
        server = subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True)
    try:
        t0 = time.monotonic()
        while not http_ready(f"127.0.0.1:{http}") and server.poll() is None and time.monotonic() - t0 < 600:
            time.sleep(1)
        if not http_ready(f"127.0.0.1:{http}"):
            print(f"FAIL serve: not ready (log {log.relative_to(ROOT)})", flush=True)
            r.results.append(("serve", "FAIL"))
            for name in ("check", "bench"):
                r.skip(name, "needs serve")
            return
        print(f"PASS serve ({time.monotonic() - t0:.0f}s): .venv's trt-spec serve, ready on :{http}", flush=True)
        r.results.append(("serve", "PASS"))
        # the GPU chain's {TOKENIZER}: the imported target, written by this venv's transformers (a directory written
        # by .venv's transformers 5 names tokenizer_class TokenizersBackend, which 4.57 cannot load)
        tok = str(OUT / "hf" / "target")
        url = ["--url", f"127.0.0.1:{grpc}", "--tokenizer", tok, "--limit", "2", "--max-tokens", "32"]
        if r.status("import-target") != "PASS":
            for name in ("check", "bench"):
                r.skip(name, "needs import-target (the tokenizer)")
            return
        r.run("check", twin_cli + ["check", *url, "--wait", "120"], timeout_s=900)
        r.run("bench", twin_cli + ["bench", "served", *url, "--out", str(OUT / "bench")], timeout_s=900)
    finally:
        _stop(server)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd")
    q = sub.add_parser("quantize")
    for a in ("hf_dir", "out_dir", "calib_dir"):
        q.add_argument(a)
    q.add_argument("calib_size", type=int)
    q.add_argument("seq_len", type=int)
    c = sub.add_parser("checkpoint")
    c.add_argument("ckpt")
    c.add_argument("hf_dir")
    sub.add_parser("pins")
    sub.add_parser("served-imports")
    a = ap.parse_args(argv)
    if a.cmd == "quantize":
        print(quantize_export(a.hf_dir, a.out_dir, a.calib_dir, a.calib_size, a.seq_len))
        return 0
    if a.cmd == "checkpoint":
        print(check_checkpoint(a.ckpt, a.hf_dir))
        return 0
    if a.cmd == "pins":
        print(check_pins())
        return 0
    if a.cmd == "served-imports":
        print(check_served_imports())
        return 0
    t0 = time.monotonic()
    r = Runner(OUT / "logs")
    print(f"image twin: {sys.executable} (pins {PINS.relative_to(ROOT)}), logs {r.logs.relative_to(ROOT)}", flush=True)
    r.run("pins", self_argv("pins"))
    build_links(r)
    r.run("served-imports", self_argv("served-imports"))
    try:
        client_links(r)
    except Exception as e:  # noqa: BLE001 (a crash here is this link's FAIL, not a lost report)
        r.results.append(("clients", "FAIL"))
        print(f"FAIL clients: {type(e).__name__}: {e}", flush=True)
    counts = {s: sum(1 for _, x in r.results if x == s) for s in ("PASS", "FAIL", "SKIP")}
    print(f"image twin: {counts['PASS']} passed, {counts['FAIL']} failed, {counts['SKIP']} skipped "
          f"in {time.monotonic() - t0:.0f}s")  # fmt: skip
    return 1 if counts["FAIL"] else 0


if __name__ == "__main__":
    sys.exit(main())
