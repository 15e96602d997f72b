"""The `parameters` blocks of the text models' config.pbtxt as typed records. Field names are the keys, a nested
record's prefixed with its name (suffix_cache_max_tokens); a missing or empty value takes the default.
"""

from __future__ import annotations

from dataclasses import MISSING, dataclass, fields, is_dataclass
from enum import Enum
from typing import ClassVar, Mapping, Optional, TypeVar, get_args, get_type_hints

from ..errors import TrtSpecError
from .backend_contract import max_input_len
from .defaults import ADD_SPECIAL_TOKENS
from .deployment import SuffixCacheConfig
from .names import BLS, PREPROCESSING
from .speculation import BLS_MODES, Mode, Policy, Proposer, as_words

BOOLS = {"true": True, "false": False}  # all a reader accepts


class ParameterError(TrtSpecError, ValueError):
    """A model config's parameter is missing or not of its type."""


def _to_string(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _parse(model: str, key: str, raw: str, kind: type) -> object:
    choices = tuple(m.value for m in kind) if isinstance(kind, type) and issubclass(kind, Enum) else None
    if kind is bool:
        if raw not in BOOLS:
            raise ParameterError(f"{model} parameter {key}: expected true or false, got {raw!r}")
        return BOOLS[raw]
    if kind is int:
        try:
            return int(raw)
        except ValueError:
            raise ParameterError(f"{model} parameter {key}: expected an integer, got {raw!r}") from None
    if choices is not None and raw not in choices:
        raise ParameterError(f"{model} parameter {key}: {raw!r} is not one of {', '.join(choices)}")
    return kind(raw)


R = TypeVar("R", bound="_Parameters")


class _Parameters:
    """The shared string form of a parameters record (subclasses are frozen dataclasses)."""

    MODEL: ClassVar[str]

    def to_parameters(self) -> dict[str, str]:
        """key -> string value, in field order; None fields are left out."""
        return _flat(self, "")

    @classmethod
    def from_parameters(cls: type[R], p: Mapping[str, str]) -> R:
        """The record of a config's parameters; ParameterError on a bad one."""
        return _read(cls, p, "", cls.MODEL)


def _flat(record: object, prefix: str) -> dict[str, str]:
    out = {}
    for f in fields(record):
        v = getattr(record, f.name)
        if is_dataclass(v):
            out.update(_flat(v, f"{prefix}{f.name}_"))
        elif v is not None:
            out[prefix + f.name] = _to_string(v)
    return out


def _read(cls: type, p: Mapping[str, str], prefix: str, model: str) -> object:
    hints = get_type_hints(cls)
    values = {}
    for f in fields(cls):
        key = prefix + f.name
        kind = next((t for t in get_args(hints[f.name]) if t is not type(None)), hints[f.name])  # Optional[X]: X
        if is_dataclass(kind):
            values[f.name] = _read(kind, p, f"{key}_", model)
            continue
        raw = p.get(key)
        if raw is None or raw == "":
            if f.default is MISSING:
                raise ParameterError(
                    f"{model} parameter {key} is missing; write the repository again with `trt-spec repo`"
                )
            continue
        values[f.name] = _parse(model, key, raw, kind)
    return cls(**values)


@dataclass(frozen=True, kw_only=True)
class BlsParameters(_Parameters):
    """The speculative `tensorrt_llm_bls` model's parameters, in the writer's order."""

    MODEL: ClassVar[str] = BLS

    tensorrt_llm_model_name: str
    tensorrt_llm_draft_model_name: str = ""  # draft_target mode only
    speculative_mode: str  # "engine": the target engine drafts by itself
    max_draft_len: int  # K built into the target engine
    num_draft_tokens: int  # the k of a request that names none
    ngram_size: int
    draft_len_policy: Policy
    proposer: Proposer  # n-gram mode's draft-free proposer
    max_seq_len: int
    max_num_tokens: int
    max_input_len: Optional[int] = None  # prompt limit in tokens (None: the engine's)
    tokenizer_dir: str
    add_special_tokens: bool = ADD_SPECIAL_TOKENS  # must match preprocessing, or identity compares other prompts
    suffix_cache: SuffixCacheConfig = SuffixCacheConfig()

    def __post_init__(self):  # plain strings become enum members
        as_words(self)
        if self.speculative_mode not in BLS_MODES:
            raise ParameterError(
                f"{self.MODEL} parameter speculative_mode: {self.speculative_mode!r} is not one of "
                + ", ".join(BLS_MODES)
            )
        if self.speculative_mode == Mode.DRAFT_TARGET and not self.tensorrt_llm_draft_model_name:
            raise ParameterError("draft_target mode needs tensorrt_llm_draft_model_name")

    @property
    def draft(self) -> Optional[str]:
        return self.tensorrt_llm_draft_model_name or None

    @property
    def engine_input_limit(self) -> int:
        """The longest input the target engine takes."""
        return max_input_len(self.max_seq_len, self.max_num_tokens)


@dataclass(frozen=True, kw_only=True)
class PreprocessingParameters(_Parameters):
    """The `preprocessing` model's parameters."""

    MODEL: ClassVar[str] = PREPROCESSING

    tokenizer_dir: str
    max_input_len: int  # prompt limit in tokens
    add_special_tokens: bool = ADD_SPECIAL_TOKENS
