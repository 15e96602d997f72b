"""The `parameters` blocks of the text models' config.pbtxt, as typed records: one writer, several readers.

Triton hands a python model its config's parameters as strings. The `tensorrt_llm_bls` block is written by the
repository writer (repository/writer.py bls_config) and read by the BLS itself (model_repo/tensorrt_llm_bls), by the
speculative loop's config (in_triton/speculative_loop.LoopConfig), by `bench in-process` (harness/inprocess.py) and
by the OpenAI frontend (serve/openai_requests.FrontendSettings); the `preprocessing` block by the writer and the
preprocessing model. Each block is one frozen dataclass here whose field names are the parameter keys exactly:
`to_parameters()` gives the strings the writer puts in config.pbtxt, `from_parameters()` parses them back, so the
readers cannot disagree on a key's spelling, type or default.

Parsing: a missing or empty value takes the field's default; a required key without one, or a value of the wrong
type, is one ParameterError line naming the model and the key.
"""

from __future__ import annotations

from dataclasses import MISSING, dataclass, fields
from typing import ClassVar, Mapping, Optional, TypeVar, get_args, get_type_hints

from ..errors import TrtSpecError
from . import defaults
from .defaults import ADD_SPECIAL_TOKENS
from .names import BLS, PREPROCESSING
from .speculation import BLS_MODES, CACHE_SCOPES, POLICIES, PROPOSERS, CacheScope, Policy, Proposer

BOOLS = {"true": True, "false": False}  # how the writer spells a bool (and all a reader accepts)


class ParameterError(TrtSpecError, ValueError):
    """A model config's parameter is missing or not of its type: one line naming the model and the key."""


def _to_string(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _parse(model: str, key: str, raw: str, kind: type, choices: Optional[tuple[str, ...]]) -> object:
    """One parameter's string as its field's type (kind: bool, int, str or a str enum)."""
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
    """The shared string form of a parameters record (subclasses are frozen dataclasses; MODEL names the model)."""

    MODEL: ClassVar[str]
    CHOICES: ClassVar[dict[str, tuple[str, ...]]] = {}  # key -> the values a str key may take

    def to_parameters(self) -> dict[str, str]:
        """The parameters block as written: key -> string value, in field order; None fields are left out."""
        return {f.name: _to_string(getattr(self, f.name)) for f in fields(self) if getattr(self, f.name) is not None}

    @classmethod
    def from_parameters(cls: type[R], p: Mapping[str, str]) -> R:
        """The record of a config's parameters (key -> string value); ParameterError, one line, on a bad one."""
        hints = get_type_hints(cls)
        values = {}
        for f in fields(cls):
            raw = p.get(f.name)
            if raw is None or raw == "":
                if f.default is MISSING:
                    raise ParameterError(
                        f"{cls.MODEL} parameter {f.name} is missing; write the repository again with `trt-spec repo`"
                    )
                continue
            kind = next((t for t in get_args(hints[f.name]) if t is not type(None)), hints[f.name])  # Optional[X]: X
            values[f.name] = _parse(cls.MODEL, f.name, raw, kind, cls.CHOICES.get(f.name))
        return cls(**values)


@dataclass(frozen=True, kw_only=True)
class BlsParameters(_Parameters):
    """The `tensorrt_llm_bls` model's parameters (the speculative model), in the writer's order."""

    MODEL: ClassVar[str] = BLS
    CHOICES: ClassVar[dict[str, tuple[str, ...]]] = {
        "speculative_mode": BLS_MODES,
        "draft_len_policy": POLICIES,
        "proposer": PROPOSERS,
        "suffix_cache_scope": CACHE_SCOPES,
    }

    tensorrt_llm_model_name: str  # the target engine model
    tensorrt_llm_draft_model_name: str = ""  # the draft engine model (draft_target mode); "" for none
    speculative_mode: str  # BLS_MODES: the loop's mode, or "engine" when the target engine drafts by itself
    max_draft_len: int  # K built into the target engine
    num_draft_tokens: int  # the k of a request that names none (records.defaults.served_num_draft_tokens)
    ngram_size: int
    draft_len_policy: Policy  # one of POLICIES (the loop's)
    proposer: Proposer  # n-gram mode's draft-free proposer
    max_seq_len: int
    max_num_tokens: int
    max_input_len: Optional[int] = None  # the deployment's prompt limit in tokens (None: the engine's)
    tokenizer_dir: str  # absolute (writer ABSOLUTE_PATHS); relative to the repository in older ones (PATH_PARAMETERS)
    # tokenized as preprocessing does, or identity compares other prompts
    add_special_tokens: bool = ADD_SPECIAL_TOKENS
    # the suffix proposer's cross-request cache (speculative.suffix_cache; absent in older repositories: the defaults)
    suffix_cache_scope: CacheScope = CacheScope(defaults.SUFFIX_CACHE_SCOPE)
    suffix_cache_max_tokens: int = defaults.SUFFIX_CACHE_MAX_TOKENS
    suffix_cache_max_sequences: int = defaults.SUFFIX_CACHE_MAX_SEQUENCES
    suffix_cache_max_tenants: int = defaults.SUFFIX_CACHE_MAX_TENANTS

    def __post_init__(self):  # a caller's plain string becomes its enum member: the fields hold their types
        object.__setattr__(self, "draft_len_policy", Policy(self.draft_len_policy))
        object.__setattr__(self, "proposer", Proposer(self.proposer))
        object.__setattr__(self, "suffix_cache_scope", CacheScope(self.suffix_cache_scope))


@dataclass(frozen=True, kw_only=True)
class PreprocessingParameters(_Parameters):
    """The `preprocessing` model's parameters (text -> token ids for the ensemble)."""

    MODEL: ClassVar[str] = PREPROCESSING

    tokenizer_dir: str
    max_input_len: int  # the deployment's prompt limit in tokens
    add_special_tokens: bool = ADD_SPECIAL_TOKENS
