"""Calibration sets for ModelOpt's quantize.py, checked before anything expensive, and their fingerprint.

A local directory is read as load_dataset(dir, split="train")["text"], so `datasets`' layout rules apply
(upstream-facts: quantize-calib-dataset-branches). `quantization.calib_dataset` is a directory or
`pkg:<module>/<dir>`; BUNDLED_CALIB_DATASET (short English texts in train.jsonl) calibrates without a download.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from ..reference.checkpoints import PKG_PREFIX, package_path
from .model_info import PreflightError
from .trtllm import DTYPE_FOR_FORMAT, QUANTIZE_CALIBRATED

BUNDLED_CALIB_DATASET = "pkg:trt_spec/builder/calib_sets/trt-spec-mixed-v1"
# Old configs and manifests name the bundled set by its former path.
RENAMED_PKG_PREFIXES = {"pkg:trt_spec/build/": "pkg:trt_spec/builder/"}
HUB_DEFAULT = "cnn_dailymail"  # quantize.py's default --calib_dataset

# datasets' packaged builders by data-file extension (the ones a text calibration set can use)
BUILDERS = {
    ".jsonl": "json",
    ".json": "json",
    ".csv": "csv",
    ".tsv": "csv",
    ".txt": "text",
    ".parquet": "parquet",
    ".arrow": "arrow",
}
_TRAIN_WORDS = {"train", "training"}
_OTHER_SPLITS = {"test", "testing", "eval", "evaluation", "validation", "valid", "val", "dev"}
_NOT_DATA = {"dataset_info.json", "dataset_infos.json"}  # dataset metadata, not rows
_SAVED = ("state.json", "dataset_dict.json")  # Dataset.save_to_disk / DatasetDict.save_to_disk


@dataclass(frozen=True)
class CalibSet:
    """The calibration set a build uses. path: the directory quantize.py reads (None: downloaded); samples: the rows
    it takes (None: not counted)."""

    dataset: str
    path: Optional[str]
    samples: Optional[int]
    calib_size: int
    max_seq_length: int
    files: tuple[str, ...] = ()  # the data files of the train split, relative to path

    def describe(self) -> str:
        if self.path is None:
            return (
                f"{self.dataset} (quantize.py's default: downloaded from the Hugging Face Hub at build time; "
                f"{self.calib_size} samples x {self.max_seq_length} tokens)"
            )
        n = (
            f"up to {self.calib_size} samples"
            if self.samples is None
            else f"{self.samples} samples"
            + (f" (all it has; calib_size {self.calib_size})" if self.samples < self.calib_size else "")
        )
        where = "" if self.dataset == self.path else f" at {self.path}"
        return f"{self.dataset}{where} ({n} x {self.max_seq_length} tokens, local)"


def quantizes(engine: str, runtime: str, weights: str) -> bool:
    """The build runs quantize.py (which loads the 16-bit model on the GPUs)."""
    return engine == "tensorrt" and runtime == "engine" and weights not in DTYPE_FOR_FORMAT


def calibrates(engine: str, runtime: str, weights: str, kv_cache: str) -> bool:
    """quantize.py reads --calib_dataset: a calibrated format or a quantized KV cache."""
    return quantizes(engine, runtime, weights) and (weights in QUANTIZE_CALIBRATED or kv_cache != "none")


def resolve(spec: str) -> Path:
    """`pkg:module/rel/dir` -> that directory in the installed package (not imported); a path -> absolute.

    Raises PreflightError when the package is not installed."""
    if not spec.startswith(PKG_PREFIX):
        return Path(spec).expanduser().absolute()
    for old, new in RENAMED_PKG_PREFIXES.items():
        if spec.startswith(old):
            spec = new + spec[len(old) :]
    path = package_path(spec)
    if path is None:
        module = spec[len(PKG_PREFIX) :].partition("/")[0]
        raise PreflightError(
            f"quantization.calib_dataset {spec}: no installed package {module!r} holds it; use "
            f"pkg:<module>/<dir> of an installed package (trt-spec's own: {BUNDLED_CALIB_DATASET}) "
            "or a local directory"
        )
    return path


def _split_of(rel: Path) -> Optional[str]:
    """The split `datasets` infers from a data file's name: train / another split / None."""
    for part in (*rel.parts[:-1], rel.stem):
        words = set(re.split(r"[-._ 0-9]+", part.lower()))
        if words & _TRAIN_WORDS:
            return "train"
        if words & _OTHER_SPLITS:
            return "other"
    return None


def _readme_configs(d: Path) -> Optional[str]:
    """README.md's YAML front matter when it declares `configs:` (the layout `datasets` then uses)."""
    f = d / "README.md"
    if not f.is_file():
        return None
    text = f.read_text(errors="replace")
    if not text.startswith("---"):
        return None
    head = text[3:].split("\n---", 1)[0]
    return head if re.search(r"^configs:", head, re.M) else None


def _train_files(d: Path, what: str) -> list[Path]:
    files = sorted(
        p for p in d.rglob("*") if p.is_file() and not any(s.startswith((".", "__")) for s in p.relative_to(d).parts)
    )
    data = [p for p in files if p.suffix.lower() in BUILDERS and p.name not in _NOT_DATA]
    if not data:
        raise PreflightError(
            f"{what}: no data files ({', '.join(sorted(BUILDERS))}) in {d}; quantize.py reads it with "
            "datasets.load_dataset(DIR, split='train'): put the texts in DIR/train.jsonl, one "
            '{"text": "..."} a line'
        )
    splits = {p: _split_of(p.relative_to(d)) for p in data}
    if any(s is not None for s in splits.values()):
        data = [p for p in data if splits[p] == "train"]
        if not data:
            raise PreflightError(
                f"{what}: its files name splits but none is a train split; quantize.py reads "
                "split='train': name the file train.jsonl (or train-*.parquet)"
            )
    kinds = sorted({BUILDERS[p.suffix.lower()] for p in data})
    if len(kinds) > 1:
        raise PreflightError(
            f"{what}: its train split mixes {' and '.join(kinds)} files; datasets.load_dataset reads "
            "one format per directory: keep one"
        )
    return data


def _json_rows(f: Path, limit: int, what: str):
    text = f.read_text(encoding="utf-8", errors="strict")
    head = text.lstrip()[:1]
    if head == "[":
        rows = json.loads(text)
        yield from ((i + 1, r) for i, r in enumerate(rows[:limit]))
    elif head == "{" and f.suffix.lower() == ".json" and "\n{" not in text.strip():
        obj = json.loads(text)  # one object: columns (datasets reads {"text": [...]} as a table)
        col = obj.get("text")
        if not isinstance(col, list):
            raise PreflightError(
                f'{what}: {f.name} is one JSON object without a "text" list; write one '
                '{"text": "..."} a line (JSON lines)'
            )
        yield from ((i + 1, {"text": t}) for i, t in enumerate(col[:limit]))
    else:
        n = 0
        for i, line in enumerate(text.splitlines(), 1):
            if n >= limit:
                return
            if line.strip():
                try:
                    yield i, json.loads(line)
                except json.JSONDecodeError as e:
                    raise PreflightError(
                        f'{what}: {f.name} line {i} is not JSON ({e.msg}); write one {{"text": "..."}} a line'
                    ) from None
                n += 1


def _count_rows(data: list[Path], kind: str, limit: int, what: str) -> Optional[int]:
    """Rows of the train split up to `limit`, each checked to have a string "text"; None where not counted."""
    n = 0
    for f in data:
        if n >= limit:
            break
        if kind == "json":
            try:
                for line, row in _json_rows(f, limit - n, what):
                    text = row.get("text") if isinstance(row, dict) else None
                    if not isinstance(text, str):
                        got = f"a {type(text).__name__}" if isinstance(row, dict) and "text" in row else 'no "text"'
                        raise PreflightError(
                            f"{what}: {f.name} row {line} has {got}; quantize.py tokenizes each row's "
                            '"text" column: every row needs a string "text"'
                        )
                    n += 1
            except (UnicodeDecodeError, json.JSONDecodeError) as e:
                raise PreflightError(
                    f'{what}: {f.name} is not UTF-8 JSON ({e}); write one {{"text": "..."}} a line'
                ) from None
        elif kind == "csv":
            sep = "\t" if f.suffix.lower() == ".tsv" else ","
            reader = csv.DictReader(io.StringIO(f.read_text(encoding="utf-8", errors="replace")), delimiter=sep)
            if "text" not in (reader.fieldnames or []):
                raise PreflightError(
                    f'{what}: {f.name} has no "text" column (columns: '
                    f"{', '.join(reader.fieldnames or []) or 'none'}); quantize.py reads column text"
                )
            for _ in reader:
                n += 1
                if n >= limit:
                    break
        elif kind == "text":  # one row a line, in a column named text
            n += min(limit - n, len(f.read_text(encoding="utf-8", errors="replace").splitlines()))
        else:  # parquet / arrow: the schema names its columns near the end (parquet footer) or the start (arrow)
            raw = f.read_bytes()
            if kind == "parquet" and not (raw[:4] == b"PAR1" and raw[-4:] == b"PAR1"):
                raise PreflightError(f"{what}: {f.name} is not a parquet file (no PAR1 magic)")
            if b"text" not in (raw[-65536:] if kind == "parquet" else raw[:65536]):
                raise PreflightError(
                    f"{what}: {f.name} has no column named text in its schema; quantize.py reads column text"
                )
            return None
    return n


def check_calib_dataset(spec: Optional[str], calib_size: int, max_seq_length: int, *, require: bool) -> CalibSet:
    """The calibration set quantize.py will read, validated as it reads it; spec None: the Hub default.

    Raises PreflightError; an absent directory only when `require`."""
    if spec is None:
        return CalibSet(HUB_DEFAULT, None, None, calib_size, max_seq_length)
    what = f"quantization.calib_dataset {spec}"
    d = resolve(spec)
    s = str(d)
    if s == "pileval" or "scienceqa" in s.lower() or "science_qa" in s.lower():
        raise PreflightError(
            f"{what}: quantize.py treats a path containing pileval/scienceqa as that hub dataset "
            "(ScienceQA: a multimodal path); rename the directory"
        )
    if not d.exists():
        if require or spec.startswith(PKG_PREFIX):
            raise PreflightError(
                f"{what}: directory not found ({d}); point it at a local dataset directory, use "
                f"the bundled {BUNDLED_CALIB_DATASET}, or remove it (quantize.py then downloads "
                "cnn_dailymail)"
            )
        return CalibSet(spec, s, None, calib_size, max_seq_length)
    if not d.is_dir():
        raise PreflightError(
            f"{what}: a file; quantize.py takes a directory (datasets.load_dataset(DIR, "
            f"split='train')): move it into a directory as train{d.suffix or '.jsonl'}"
        )
    if any((d / f).exists() for f in _SAVED):
        raise PreflightError(
            f"{what}: a Dataset.save_to_disk folder, which quantize.py's datasets.load_dataset does "
            "not read; write it as DIR/train.jsonl (Dataset.to_json) and point calib_dataset at DIR"
        )
    if "cnn_dailymail" in s:
        if not ((d / "3.0.0").is_dir() or re.search(r"config_name:\s*['\"]?3\.0\.0", _readme_configs(d) or "")):
            raise PreflightError(
                f"{what}: quantize.py loads a path containing 'cnn_dailymail' as the cnn_dailymail "
                "dataset (config 3.0.0, column article), but this directory has no 3.0.0 config; "
                "copy the Hub repository abisee/cnn_dailymail whole, or rename the directory and "
                "give it a train split with a text column"
            )
        return CalibSet(spec, s, None, calib_size, max_seq_length)
    if _readme_configs(d) is not None:  # trusted, not inspected
        return CalibSet(spec, s, None, calib_size, max_seq_length)
    data = _train_files(d, what)
    kind = BUILDERS[data[0].suffix.lower()]
    n = _count_rows(data, kind, calib_size, what)
    if n == 0:
        raise PreflightError(f"{what}: the train split has no rows; quantize.py would calibrate on nothing")
    return CalibSet(spec, s, n, calib_size, max_seq_length, tuple(p.relative_to(d).as_posix() for p in data))


def fingerprint(path: Optional[str]) -> Optional[str]:
    """sha256 over a calibration directory's data files, names and contents; None when not on this machine."""
    if path is None or not Path(path).is_dir():
        return None
    d = Path(path)
    h = hashlib.sha256()
    for p in sorted(
        q for q in d.rglob("*") if q.is_file() and not any(s.startswith((".", "__")) for s in q.relative_to(d).parts)
    ):
        h.update(p.relative_to(d).as_posix().encode() + b"\0")
        with p.open("rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        h.update(b"\0")
    return "sha256:" + h.hexdigest()
