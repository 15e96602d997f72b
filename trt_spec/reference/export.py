"""Reference-engine "compilation": a Hugging Face checkpoint -> an engine directory.

FP8 stores each 2-D weight as float8_e4m3fn with a per-output-channel fp32 `<name>.scale` (amax / 448); the engine
dequantizes once to fp32. trt_spec_engine.json records the quantization report and the `build_config` limits that
trtllm-build would bake in, which the stand-in enforces. Output is byte-reproducible (no timestamps in files).
"""

from __future__ import annotations

import argparse
import json
import shutil
import struct
import sys
import time
from pathlib import Path

import torch

from ..records.backend_contract import LOGITS_DTYPE, LOGITS_DTYPES
from ..records.names import TOKENIZER_FILES
from ..records.speculation import POLICIES, Policy
from .model import ReferenceModel, load_hf_state_dict

ENGINE_FORMAT = "trt-spec-reference"
ENGINE_META = "trt_spec_engine.json"
FP8_MAX = 448.0  # largest finite float8_e4m3fn
STORE_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
SAMPLE_PROMPTS = (
    "def fibonacci(n):\n    if n < 2:\n        return n\n",
    "The capital of France is",
    "import numpy as np\n\nx = np.arange(10)\nprint(x.sum())",
    "<|im_start|>user\nWhat is speculative decoding?<|im_end|>\n<|im_start|>assistant\n",
)


def quantize_fp8(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """w [out, in] -> (q float8_e4m3fn [out, in], scale fp32 [out])."""
    w = w.float()
    amax = w.abs().amax(dim=1).clamp(min=1e-12)
    scale = amax / FP8_MAX
    q = (w / scale[:, None]).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return q, scale


def dequantize_fp8(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return q.float() * scale.float()[:, None]


def _is_quantizable(name: str, t: torch.Tensor) -> bool:
    return t.ndim == 2 and name.endswith(".weight")


def export_state_dict(sd: dict[str, torch.Tensor], weights: str) -> tuple[dict[str, torch.Tensor], dict]:
    """(stored tensors, weight-error statistics) of a state dict."""
    out: dict[str, torch.Tensor] = {}
    err_sq = ref_sq = 0.0
    worst = ("", 0.0)
    for name, t in sd.items():
        t = t.detach().float()
        if not _is_quantizable(name, t):
            out[name] = t.contiguous()
            continue
        if weights == "fp8":
            q, scale = quantize_fp8(t)
            out[name], out[name + ".scale"] = q.contiguous(), scale.contiguous()
            deq = dequantize_fp8(q, scale)
        else:
            out[name] = t.to(STORE_DTYPES[weights]).contiguous()
            deq = out[name].float()
        e, r = float((deq - t).pow(2).sum()), float(t.pow(2).sum())
        err_sq, ref_sq = err_sq + e, ref_sq + r
        rel = (e / max(r, 1e-30)) ** 0.5
        if rel > worst[1]:
            worst = (name, rel)
    stats = {
        "relative_weight_error": (err_sq / max(ref_sq, 1e-30)) ** 0.5,
        "worst_tensor": worst[0],
        "worst_tensor_relative_error": worst[1],
    }
    return out, stats


def load_engine_state_dict(engine_dir: Path) -> dict[str, torch.Tensor]:
    """An engine's fp32 state dict, FP8 weights dequantized."""
    from safetensors.torch import load_file

    raw = load_file(Path(engine_dir) / "model.safetensors")
    out = {}
    for name, t in raw.items():
        if name.endswith(".scale"):
            continue
        scale = raw.get(name + ".scale")
        out[name] = dequantize_fp8(t, scale) if scale is not None else t.float()
    return out


def read_engine_meta(engine_dir: Path) -> dict:
    f = Path(engine_dir) / ENGINE_META
    if not f.is_file():
        raise FileNotFoundError(f"{engine_dir}: not a reference engine (no {ENGINE_META}); run `trt-spec build CONFIG`")
    meta = json.loads(f.read_text())
    if meta.get("format") != ENGINE_FORMAT:
        raise ValueError(f"{engine_dir}: unknown engine format {meta.get('format')!r}")
    return meta


def top1_agreement(
    config: dict, full: dict[str, torch.Tensor], quant: dict[str, torch.Tensor], tokenizer_dir: Path
) -> dict:
    """Share of positions where the exported model's argmax equals full precision's."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    a, b = ReferenceModel.from_state_dict(config, full), ReferenceModel.from_state_dict(config, quant)

    def logits(model, ids):  # [S, V]
        t = torch.tensor([ids])
        return model.forward(t, torch.arange(len(ids))[None], model.new_cache(1, len(ids)))[0]

    agree = total = 0
    for text in SAMPLE_PROMPTS:
        ids = tok(text)["input_ids"]
        agree += int((logits(a, ids).argmax(-1) == logits(b, ids).argmax(-1)).sum())
        total += len(ids)
    return {"top1_agreement": agree / total, "positions": total, "prompts": len(SAMPLE_PROMPTS)}


def save_safetensors(tensors: dict[str, torch.Tensor], path: Path, metadata: dict[str, str]) -> None:
    """safetensors.save_file, then rewrite the header sorted (the library writes metadata in hash order)."""
    from safetensors.torch import save_file

    save_file(tensors, str(path), metadata=metadata)
    with open(path, "r+b") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        meta = header.pop("__metadata__", None)
        canon = {"__metadata__": dict(sorted(meta.items()))} if meta is not None else {}
        canon.update(sorted(header.items()))
        text = json.dumps(canon, separators=(",", ":"), ensure_ascii=False).encode()
        if len(text) > n:  # not expected: same JSON, reordered
            raise RuntimeError(f"{path}: canonical safetensors header is longer than the written one")
        f.seek(8)
        f.write(text + b" " * (n - len(text)))


def export(
    checkpoint: Path,
    out: Path,
    weights: str,
    check_agreement: bool = True,
    build_config: dict | None = None,
    eagle_head: Path | None = None,
) -> dict:
    if weights not in ("fp8", *STORE_DTYPES):
        raise ValueError(f"weights {weights!r}: the reference engine exports fp8, bf16, fp16 or fp32")
    t0 = time.monotonic()
    config = json.loads((checkpoint / "config.json").read_text())
    sd = load_hf_state_dict(checkpoint)
    stored, stats = export_state_dict(sd, weights)
    out.mkdir(parents=True, exist_ok=True)
    save_safetensors(stored, out / "model.safetensors", {"format": ENGINE_FORMAT, "weights": weights})
    (out / "config.json").write_text(json.dumps(config, indent=2))
    for name in TOKENIZER_FILES:
        if (checkpoint / name).is_file():
            shutil.copy2(checkpoint / name, out / name)
    if eagle_head is not None:  # kept fp32: small next to the target
        from .eagle import HEAD_DIR

        (out / HEAD_DIR).mkdir(exist_ok=True)
        for name in ("config.json", "model.safetensors"):
            shutil.copy2(eagle_head / name, out / HEAD_DIR / name)
    report = {"weights": weights, **stats}
    if check_agreement and (checkpoint / "tokenizer.json").is_file():
        report.update(
            top1_agreement(config, {k: v.float() for k, v in sd.items()}, load_engine_state_dict(out), checkpoint)
        )
    meta = {
        "format": ENGINE_FORMAT,
        "version": 1,
        "weights": weights,
        "source": str(checkpoint),
        "architecture": (config.get("architectures") or ["?"])[0],
        "quantization_report": report,
        "bytes": (out / "model.safetensors").stat().st_size,
        "build_config": build_config or {},
    }
    (out / ENGINE_META).write_text(json.dumps(meta, indent=2, sort_keys=True))
    return {**meta, "seconds": round(time.monotonic() - t0, 1)}  # not in the file: keeps it reproducible


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Export a Hugging Face checkpoint to a trt-spec reference engine.")
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--output_dir", required=True)
    ap.add_argument("--weights", default="fp8", choices=["fp8", *STORE_DTYPES])
    ap.add_argument("--no-agreement-check", action="store_true", help="skip the FP8-vs-full top-1 check")
    # the engine's limits, named like trtllm-build's flags
    ap.add_argument("--max_batch_size", type=int, required=True)
    ap.add_argument("--max_seq_len", type=int, required=True)
    ap.add_argument("--max_num_tokens", type=int, required=True)
    ap.add_argument("--speculative_decoding_mode", default=None)
    ap.add_argument("--max_draft_len", type=int, default=0)
    ap.add_argument("--eagle_head", default=None, help="an EAGLE-3 head directory to carry (speculative mode eagle)")
    ap.add_argument(
        "--eagle_draft_policy",
        default=Policy.ADAPTIVE.value,
        choices=list(POLICIES),
        help="mode eagle: the chain's draft length, k per step from measured costs and acceptance (k = 0 included) "
        "or always max_draft_len (records/draft_policy.py, as the BLS's loop)",
    )
    # the stand-in applies the kernels' temperature rule and clamp in this dtype
    ap.add_argument("--logits_dtype", default=LOGITS_DTYPE, choices=LOGITS_DTYPES)
    # without it return_generation_logits is refused (backend_contract.NO_GENERATION_LOGITS)
    ap.add_argument("--gather_generation_logits", action="store_true")
    a = ap.parse_args(argv)
    torch.set_num_threads(max(1, torch.get_num_threads()))
    build_config = {
        "max_batch_size": a.max_batch_size,
        "max_seq_len": a.max_seq_len,
        "max_num_tokens": a.max_num_tokens,
        "max_beam_width": 1,
        "speculative_decoding_mode": a.speculative_decoding_mode,
        "max_draft_len": a.max_draft_len,
        "gather_generation_logits": a.gather_generation_logits,
        "logits_dtype": a.logits_dtype,
    }
    if a.eagle_head:
        build_config["eagle_draft_policy"] = a.eagle_draft_policy
    meta = export(
        Path(a.checkpoint),
        Path(a.output_dir),
        a.weights,
        not a.no_agreement_check,
        build_config,
        Path(a.eagle_head) if a.eagle_head else None,
    )
    print(json.dumps({**meta["quantization_report"], "seconds": meta["seconds"]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
