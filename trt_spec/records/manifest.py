"""Typed build records as versioned JSON: manifest.json (what the build made, with engine checksums) and
trt_spec_repo.json (how to launch a repository). A foreign or other-version file is one ManifestError line.

Standard library only at import: the Triton python models read trt_spec_repo.json.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import os
import shlex
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Literal, Optional, Union

from ..errors import TrtSpecError
from .deployment import Deployment, Speculation

if TYPE_CHECKING:
    from .config import BuildConfig

MANIFEST = "manifest.json"  # in the build directory
REPO_META = "trt_spec_repo.json"  # at the repository root
SCHEMA_VERSION = 2  # manifest.json; bump on any change a reader of the previous version would misread
REPO_SCHEMA_VERSION = 3  # trt_spec_repo.json
MANIFEST_VERSION_KEY = "trt_spec_manifest_version"
REPO_VERSION_KEY = "trt_spec_repo_version"

Sums = dict[str, dict]  # relative posix path -> {"size": int, "sha256": hex} (integrity.file_sums)


class ManifestError(TrtSpecError, ValueError):
    """A record that cannot be used: the file, what is wrong, and the command that writes a current one."""


@dataclass(frozen=True)
class EngineEntry:
    """One built engine (the target's or the draft's)."""

    dir: str  # absolute engine directory (gpt_model_path)
    checkpoint: Optional[str]
    tp: int
    pp: int
    world_size: int
    devices: list[int]  # GPU ids
    weights: str
    kv_cache: str
    argv: list[str]  # the command that built it
    fingerprint: str
    max_draft_len: int  # 0 for the draft
    gather_generation_logits: bool
    step: str  # trt-spec build --only STEP
    files: Optional[Sums] = None  # size + sha256 per file as the build wrote it; None before it is built


@dataclass(frozen=True)
class GpuRecord:
    name: str
    compute_capability: list[int]  # [major, minor]
    memory_gib: float
    count: int
    source: str  # "nvidia-smi" | "config"


@dataclass(frozen=True)
class StepRecord:
    name: str
    status: str  # ran | skipped
    seconds: float


@dataclass(frozen=True)
class CalibrationRecord:
    """The set quantize.py calibrated on (path None: downloaded)."""

    dataset: str
    path: Optional[str]
    fingerprint: Optional[str]  # "sha256:<hex>" over the directory's files; None when downloaded or absent
    samples: Optional[int]  # rows taken; None when not counted
    calib_size: int
    max_seq_length: int


@dataclass(frozen=True)
class EngineSums:
    """What verifying one engine needs: its sums and the command that rebuilds it."""

    step: Optional[str]
    config_path: Optional[str]
    files: Sums


@dataclass(frozen=True)
class BuildManifest:
    """<build_dir>/manifest.json: written by the runner once every step is up to date."""

    name: str
    config_path: Optional[str]
    config_hash: str
    config: BuildConfig
    engine: Literal["tensorrt", "reference"]
    created: str  # ISO 8601, UTC
    tool_versions: dict[str, Optional[str]]
    gpu: Optional[GpuRecord]  # None for the reference engine
    deployment: Deployment
    engines: dict[str, EngineEntry]  # role ("target", "draft") -> engine
    steps: list[StepRecord]
    calibration: Optional[CalibrationRecord] = None  # None: nothing calibrated

    def __post_init__(self) -> None:
        if "target" not in self.engines:
            raise _Damaged("engines.target: missing")

    @property
    def target(self) -> EngineEntry:
        return self.engines["target"]

    @property
    def speculation(self) -> Speculation:
        return self.deployment.speculation

    @property
    def draft(self) -> Optional[EngineEntry]:
        return self.engines.get("draft")

    def engine_sums(self) -> dict[str, EngineSums]:
        """Engine dir -> its sums, for the engines built with checksums."""
        return {e.dir: EngineSums(e.step, self.config_path, e.files) for e in self.engines.values() if e.files}

    def to_json(self) -> dict:
        return {MANIFEST_VERSION_KEY: SCHEMA_VERSION, **_plain(self)}

    @classmethod
    def from_json(cls, data: object, source: Path) -> "BuildManifest":
        """ManifestError for an old, foreign or damaged manifest."""
        from .config import BuildConfig

        return _from_json(cls, data, source, _MANIFEST_KIND, {"BuildConfig": BuildConfig})

    def write(self, build_dir: Path) -> Path:
        return _write_json(Path(build_dir) / MANIFEST, self.to_json())

    @classmethod
    def read(cls, build_dir: Path) -> "BuildManifest":
        f = Path(build_dir) / MANIFEST
        if not f.is_file():
            raise ManifestError(
                f"{build_dir}: no {MANIFEST}; run `trt-spec build CONFIG` first (it writes the manifest)"
            )
        return cls.from_json(_load_json(f, _MANIFEST_KIND), f)


@dataclass(frozen=True)
class RepoRecord:
    """<repository>/trt_spec_repo.json: written by the repository writer next to the models."""

    name: str
    config_hash: str
    deployment: Deployment
    orchestrator: bool  # TRTLLM_ORCHESTRATOR
    mpi_ranks: int  # tritonserver processes under mpirun
    models: list[str]
    decoupled: bool
    gpu_ids: list[int]
    engines: dict[str, EngineSums]  # engine dir (gpt_model_path) -> its sums
    # load_models empty: every model; phase_models: model loaded for a measurement phase -> launch models it replaces
    load_models: list[str] = dataclasses.field(default_factory=list)
    phase_models: dict[str, list[str]] = dataclasses.field(default_factory=dict)

    def to_json(self) -> dict:
        return {REPO_VERSION_KEY: REPO_SCHEMA_VERSION, **_plain(self)}

    @classmethod
    def from_json(cls, data: object, source: Path) -> "RepoRecord":
        return _from_json(cls, data, source, _REPO_KIND, {})

    def write(self, repository: Path) -> Path:
        return _write_json(Path(repository) / REPO_META, self.to_json())

    @classmethod
    def read(cls, repository: Path) -> Optional["RepoRecord"]:
        """None when the repository has no record."""
        f = Path(repository) / REPO_META
        if not f.is_file():
            return None
        return cls.from_json(_load_json(f, _REPO_KIND), f)


def _rebuild(data: object, source: Path) -> str:
    cfg = data.get("config_path") if isinstance(data, dict) else None
    return f"rebuild with `trt-spec build {shlex.quote(cfg) if isinstance(cfg, str) else 'CONFIG'}`"


def _rewrite_repo(data: object, source: Path) -> str:
    return f"regenerate it with `trt-spec repo BUILD_DIR --out {shlex.quote(str(source.parent))}`"


@dataclass(frozen=True)
class _Kind:
    what: str  # "build manifest"
    version_key: str
    version: int
    old_keys: tuple[str, ...]  # what an unversioned file from an older trt-spec has
    fix: Callable[[object, Path], str]  # (parsed file, its path) -> the command that writes a current one


_MANIFEST_KIND = _Kind(
    "build manifest", MANIFEST_VERSION_KEY, SCHEMA_VERSION, ("config_hash", "engines", "steps"), _rebuild
)
_REPO_KIND = _Kind(
    "repository record", REPO_VERSION_KEY, REPO_SCHEMA_VERSION, ("config_hash", "engines", "mpi_ranks"), _rewrite_repo
)


def _load_json(f: Path, kind: _Kind) -> object:
    try:
        return json.loads(f.read_text())
    except OSError as e:
        raise ManifestError(f"{f}: unreadable ({e.strerror}); {kind.fix(None, f)}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ManifestError(f"{f}: not a trt-spec {kind.what} (not JSON: {e}); {kind.fix(None, f)}") from None


def _from_json(cls: type, data: object, source: Path, kind: _Kind, ns: dict):
    fix = kind.fix(data, source)
    version = data.get(kind.version_key) if isinstance(data, dict) else None
    if version is None:
        if isinstance(data, dict) and all(k in data for k in kind.old_keys):
            raise ManifestError(
                f"{source}: {kind.what} from an older trt-spec (no {kind.version_key}; this trt-spec "
                f"reads version {kind.version}); {fix}"
            )
        raise ManifestError(f"{source}: not a trt-spec {kind.what} (no {kind.version_key} field); {fix}")
    if version != kind.version:
        raise ManifestError(
            f"{source}: {kind.what} version {version!r}, this trt-spec reads version {kind.version}; {fix}"
        )
    body = {k: v for k, v in data.items() if k != kind.version_key}
    try:
        return _build(cls, body, "", ns)
    except _Damaged as e:
        raise ManifestError(f"{source}: damaged {kind.what} ({e}); {fix}") from None


def _write_json(path: Path, data: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        tmp.write_text(json.dumps(data, indent=2) + "\n")
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


class _Damaged(TrtSpecError, ValueError):
    pass


def _plain(obj: Any) -> Any:
    """A record as JSON values."""
    if dataclasses.is_dataclass(obj):
        return {f.name: _plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if hasattr(obj, "model_dump"):
        return obj.model_dump(mode="json")
    if isinstance(obj, enum.Enum):
        return obj.value
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    if isinstance(obj, dict):
        return {k: _plain(v) for k, v in obj.items()}
    return obj


def _build(tp: Any, value: Any, where: str, ns: dict) -> Any:
    """`value` (parsed JSON) as type `tp`; raises _Damaged naming the field."""
    at = where or "top level"
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise _Damaged(f"{at}: expected an object, got {type(value).__name__}")
        hints = typing.get_type_hints(tp, localns=ns)
        kw = {}
        for f in dataclasses.fields(tp):
            sub = f"{where}.{f.name}" if where else f.name
            if f.name in value:
                kw[f.name] = _build(hints[f.name], value[f.name], sub, ns)
            elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise _Damaged(f"{sub}: missing")
        return tp(**kw)
    if origin in (Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        (inner,) = [a for a in args if a is not type(None)]
        return _build(inner, value, where, ns)
    if origin is Literal:
        if value not in args:
            raise _Damaged(f"{at}: {value!r} is not one of {', '.join(map(repr, args))}")
        return value
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        try:
            return tp(value)
        except ValueError:
            raise _Damaged(f"{at}: {value!r} is not one of {', '.join(repr(m.value) for m in tp)}") from None
    if origin is tuple:
        if not isinstance(value, list):
            raise _Damaged(f"{at}: expected a list, got {type(value).__name__}")
        return tuple(_build(args[0], v, f"{where}[{i}]", ns) for i, v in enumerate(value))
    if origin is list:
        if not isinstance(value, list):
            raise _Damaged(f"{at}: expected a list, got {type(value).__name__}")
        return [_build(args[0], v, f"{where}[{i}]", ns) for i, v in enumerate(value)]
    if origin is dict or tp is dict:
        if not isinstance(value, dict):
            raise _Damaged(f"{at}: expected an object, got {type(value).__name__}")
        return {k: _build(args[1], v, f"{where}.{k}", ns) for k, v in value.items()} if args else value
    if hasattr(tp, "model_validate"):  # the pydantic BuildConfig
        try:
            return tp.model_validate(value)
        except ValueError as e:  # pydantic's ValidationError: first problem only, on one line
            first = e.errors()[0] if hasattr(e, "errors") else {"loc": (), "msg": str(e)}
            loc = ".".join(str(p) for p in first["loc"])
            raise _Damaged(f"{where}.{loc}: {first['msg']}" if loc else f"{at}: {first['msg']}") from None
    if tp is float and isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if tp in (int, str, bool) and not (isinstance(value, tp) and (tp is bool or not isinstance(value, bool))):
        raise _Damaged(f"{at}: expected {tp.__name__}, got {type(value).__name__}")
    return value
