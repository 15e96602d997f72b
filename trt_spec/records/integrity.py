"""Checksums of built outputs (size + sha256 per file), verified before they are trusted.

Standard library only: the Triton python models import it.
"""

from __future__ import annotations

import hashlib
import os
import shlex
from pathlib import Path
from typing import Iterable, Optional

from ..errors import TrtSpecError
from .manifest import ManifestError, RepoRecord

CHUNK = 8 << 20  # bytes read per hash update

Sums = dict[str, dict]  # relative posix path -> {"size": int, "sha256": hex}


class IntegrityError(TrtSpecError, ValueError):
    """A built file differs from what the build recorded (one line: the file, how it differs, the fix)."""


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    buf = bytearray(CHUNK)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(buf):
            h.update(view[:n])
    return h.hexdigest()


def _files(root: Path, skip: Iterable[str]) -> list[str]:
    skip = set(skip)
    out = []
    for d, dirs, files in os.walk(root):
        dirs.sort()
        for name in files:
            rel = Path(d, name).relative_to(root).as_posix()
            if rel not in skip:
                out.append(rel)
    return sorted(out)


def file_sums(root: Path, skip: Iterable[str] = ()) -> Sums:
    """Size and sha256 of every file under root (recursive), by relative path; `skip`: relative paths to leave out."""
    root = Path(root)
    return {rel: {"size": (root / rel).stat().st_size, "sha256": sha256_file(root / rel)} for rel in _files(root, skip)}


def mismatch(root: Path, expected: Sums) -> Optional[tuple[Path, str]]:
    """The first recorded file that differs, and how: sizes of every file first (cheap), then hashes."""
    root = Path(root)
    for rel, want in sorted(expected.items()):
        try:
            size = (root / rel).stat().st_size
        except OSError:
            return root / rel, "missing"
        if size != want["size"]:
            return root / rel, f"size {size} != {want['size']} at build time"
    for rel, want in sorted(expected.items()):
        got = sha256_file(root / rel)
        if got != want["sha256"]:
            return root / rel, f"same size, sha256 {got[:12]}... != {want['sha256'][:12]}... at build time"
    return None


def verify(root: Path, expected: Sums, fix_hint: str, kind: str = "engine file") -> None:
    """Raise IntegrityError (one line) if a file recorded in `expected` is missing or differs under root."""
    bad = mismatch(root, expected)
    if bad is not None:
        path, how = bad
        raise IntegrityError(f"{kind} {path} does not match the build ({how}); {fix_hint}")


def rebuild_hint(config_path: Optional[str], step: str) -> str:
    return f"rebuild it: trt-spec build {shlex.quote(config_path) if config_path else 'CONFIG'} --force --only {step}"


def _repo_record(repository: Path) -> Optional[RepoRecord]:
    try:
        return RepoRecord.read(Path(repository))
    except ManifestError as e:  # old, foreign or damaged
        raise IntegrityError(str(e)) from None


def verify_served_engine(repository: Path, engine_dir: str) -> None:
    """Check `engine_dir` against the sums in <repository>/trt_spec_repo.json; engines without sums pass."""
    record = _repo_record(repository)
    real = os.path.realpath(engine_dir)  # the repository names engines through symlinks
    entry = (
        next((e for d, e in record.engines.items() if d == engine_dir or os.path.realpath(d) == real), None)
        if record
        else None
    )
    if entry and entry.files:
        verify(
            Path(engine_dir),
            entry.files,
            rebuild_hint(entry.config_path, entry.step or "STEP") + ", then rerun trt-spec repo",
        )


def verify_repository_engines(repository: Path) -> int:
    """Before serving (the C++ backend checks no sums): verify every recorded engine; returns how many."""
    record = _repo_record(repository)
    engines = record.engines if record else {}
    for engine_dir in sorted(engines):
        verify_served_engine(repository, engine_dir)
    return len(engines)
