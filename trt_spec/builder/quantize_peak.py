"""Run a script (quantize.py) in this process as `python SCRIPT ARGS...` would, then write the GPU memory torch's
allocator peaked at to a JSON file: the measured number beside preflight's calibration estimate.

    python -m trt_spec.builder.quantize_peak --peak_json FILE SCRIPT [ARGS...]

FILE gets {"exit_code", "cuda", "per_device_max_allocated_gib", "max_memory_allocated_gib" (summed over devices),
"max_memory_reserved_gib"}, whatever the script's exit. Standard library at import; torch only afterwards.
"""

from __future__ import annotations

import json
import os
import runpy
import sys
from pathlib import Path
from typing import Optional

PEAK_MODULE = "trt_spec.builder.quantize_peak"
PEAK_SUFFIX = ".quantize-peak.json"  # after the step's name, beside its .log
GIB = 1024**3


def cuda_peak() -> dict:
    """torch's per-device peaks (memory outside its allocator, e.g. the CUDA context, is not counted)."""
    torch = sys.modules.get("torch")  # the script imported it; a script that never did used no GPU through torch
    if torch is None or not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return {"cuda": False, "per_device_max_allocated_gib": {}, "max_memory_allocated_gib": 0.0}
    n = torch.cuda.device_count()
    alloc = {str(d): torch.cuda.max_memory_allocated(d) / GIB for d in range(n)}
    reserved = sum(torch.cuda.max_memory_reserved(d) for d in range(n)) / GIB
    return {
        "cuda": True,
        "per_device_max_allocated_gib": {d: round(v, 3) for d, v in alloc.items()},
        "max_memory_allocated_gib": round(sum(alloc.values()), 3),
        "max_memory_reserved_gib": round(reserved, 3),
    }


def run(script: str, args: list[str], peak_json: Path) -> int:
    """Run script as __main__ with args; write the peak; return its exit code."""
    sys.argv = [script, *args]
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))  # as `python SCRIPT` puts its folder first
    code: Optional[int | str] = 0
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as e:
        code = e.code
    except BaseException:  # a traceback, as python prints it, after the peak is written
        code = 1
        raise
    finally:
        rc = code if isinstance(code, int) else (0 if code is None else 1)
        peak_json.parent.mkdir(parents=True, exist_ok=True)
        peak_json.write_text(json.dumps({"script": script, "exit_code": rc, **cuda_peak()}, indent=2) + "\n")
    if isinstance(code, str):
        print(code, file=sys.stderr)
    return rc


def main(argv: Optional[list[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) < 3 or argv[0] != "--peak_json":
        print(f"usage: python -m {PEAK_MODULE} --peak_json FILE SCRIPT [ARGS...]", file=sys.stderr)
        return 2
    return run(argv[2], argv[3:], Path(argv[1]))


if __name__ == "__main__":
    sys.exit(main())
