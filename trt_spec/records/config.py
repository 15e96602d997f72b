"""Build configuration: the typed schema of `build_configs/*.yaml`, and the one source of its defaults.

Loading order (later wins): YAML file < environment `TRT_SPEC__A__B=value` < `--set a.b=value`.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any, Literal, Optional

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_core import PydanticCustomError

from ..errors import TrtSpecError
from . import defaults
from .defaults import BUILD_ROOT, EAGLE_DRAFT_VOCAB, EAGLE_TRAIN_STEPS
from .recipes import RECIPES, Recipe, RecipeError, recipe
from .speculation import LOOP_POLICIES, CacheScope, Mode, Policy, Proposer

ENV_PREFIX = "TRT_SPEC__"

WeightFormat = Literal["fp8", "int8_sq", "int4_awq", "int8_wo", "int4_wo", "bf16", "fp16", "fp32", "auto"]
KvCacheFormat = Literal["fp8", "int8", "auto"]
Engine = Literal["tensorrt", "reference"]
RuntimeKind = Literal["engine", "llmapi"]
CheckpointDtype = Literal["auto", "float16", "bfloat16", "float32"]


class ConfigError(TrtSpecError, ValueError):
    """A user error in the build configuration."""


def _one_of(allowed: tuple[Policy, ...], value: Any) -> Any:
    """`value` if allowed, else pydantic's enum error."""
    if isinstance(value, str) and value in allowed:
        return value
    choices = [f"'{p.value}'" for p in allowed]
    raise PydanticCustomError(
        "enum", "Input should be {expected}", {"expected": " or ".join([", ".join(choices[:-1]), choices[-1]])}
    )


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class ModelSpec(_Strict):
    """One Hugging Face checkpoint and how to shard it."""

    checkpoint: str = Field(
        description="Hugging Face checkpoint directory, or pkg:<module>/<file>.gguf (a GGUF file in "
        "an installed package, imported to a Hugging Face directory at build time)"
    )
    tp: int = Field(1, ge=1, description="tensor-parallel size")
    pp: int = Field(1, ge=1, description="pipeline-parallel size")
    dtype: CheckpointDtype = Field("auto", description="activation dtype for conversion (auto = config.json)")

    @property
    def world_size(self) -> int:
        return self.tp * self.pp


class DistillSpec(_Strict):
    """Distill the draft from the target at build time (offline, seeded, bounded)."""

    hidden_size: int = Field(128, ge=32, description="draft hidden size")
    num_layers: int = Field(2, ge=1, description="draft decoder layers")
    steps: int = Field(600, ge=1, description="distillation steps (fixed count: reproducible)")
    seed: int = Field(0, description="random seed")


class DraftSpec(ModelSpec):
    checkpoint: Optional[str] = Field(None, description="draft checkpoint (null when draft.distill builds one)")
    distill: Optional[DistillSpec] = Field(None, description="distill a tiny draft from the target at build time")

    @model_validator(mode="after")
    def _one_source(self) -> "DraftSpec":
        if (self.checkpoint is None) == (self.distill is None):
            raise ValueError("give exactly one of draft.checkpoint (a model directory) or draft.distill (build one)")
        return self


class Quantization(_Strict):
    weights: WeightFormat = Field("fp8", description="weight format (auto = fp8 where the GPU has FP8, else fallback)")
    kv_cache: KvCacheFormat = Field(
        "auto", description="KV-cache format (auto = fp8 with fp8, int8 with int8_sq, else model dtype)"
    )
    fallback: Optional[Literal["int8_sq", "int4_awq", "int8_wo", "int4_wo", "bf16", "fp16"]] = Field(
        None, description="format used when the GPU has no FP8 (null = refuse to build)"
    )
    calib_dataset: Optional[str] = Field(
        None,
        description="the calibration set quantize.py reads: a local directory (datasets' layout, a text column) "
        "or pkg:<module>/<dir> (trt-spec's bundled set: pkg:trt_spec/builder/calib_sets/trt-spec-mixed-v1); null = "
        "cnn_dailymail, downloaded from the Hugging Face Hub at build time (offline hosts cannot)",
    )
    calib_size: int = Field(512, ge=1, description="calibration samples")
    calib_max_seq_length: int = Field(512, ge=16, description="calibration sequence length")

    @model_validator(mode="before")
    @classmethod
    def _fmha_removed(cls, data):
        if isinstance(data, dict) and "fp8_context_fmha" in data:
            raise ValueError(
                "fp8_context_fmha was removed: TensorRT-LLM 1.2's builder turns FP8 context FMHA on by "
                "itself with FP8 weights + FP8 KV cache + paged context FMHA on SM >= 89 (and off "
                "otherwise), whatever the flag says; delete the key"
            )
        return data


class MedusaSpec(_Strict):
    heads_dir: str = Field(description="Medusa heads checkpoint directory")
    num_heads: int = Field(4, ge=1, description="number of Medusa heads")
    choices: Optional[list[list[int]]] = Field(None, description="Medusa tree (null = TRT-LLM's mc_sim_7b_63)")


class EagleTrain(_Strict):
    """engine: reference. Train an EAGLE-3 head for the target at build time."""

    draft_vocab: int = Field(
        EAGLE_DRAFT_VOCAB, ge=16, description="draft vocabulary: the most frequent target tokens in the data"
    )
    steps: int = Field(EAGLE_TRAIN_STEPS, ge=1, description="optimizer steps")
    seed: int = Field(0, description="seed (data order, initialisation): the same seed gives the same head")
    prompts: Optional[int] = Field(None, ge=1, description="bundled training prompts to use (null = all)")


class EagleSpec(_Strict):
    heads_dir: Optional[str] = Field(
        None,
        description="EAGLE draft-head checkpoint directory (engine: tensorrt: "
        "EAGLE-1/2 heads for eagle/convert_checkpoint.py; engine: reference: an EAGLE-3 head)",
    )
    train: Optional[EagleTrain] = Field(
        None, description="engine: reference: train an EAGLE-3 head at build time instead of heads_dir"
    )
    num_layers: int = Field(4, ge=1, description="EAGLE tree depth (--num_eagle_layers)")
    max_non_leaves_per_layer: int = Field(10, ge=1, description="--max_non_leaves_per_layer")
    choices: Optional[list[list[int]]] = Field(None, description="EAGLE-1 tree (null = TRT-LLM's default)")


class Eagle3Spec(_Strict):
    """runtime: llmapi. An EAGLE-3 draft head for the target."""

    heads_dir: str = Field(description="EAGLE-3 head checkpoint directory (config.json: LlamaForCausalLMEagle3)")
    one_model: bool = Field(
        True,
        description="TensorRT-LLM's eagle3_one_model: head and target in one model "
        "(false: two models, the head as a separate draft)",
    )


class MtpSpec(_Strict):
    """runtime: llmapi. Multi-token prediction with the target's own MTP layers."""

    num_nextn_predict_layers: int = Field(1, ge=1, description="draft tokens per step (MTPDecodingConfig)")


class LookaheadSpec(_Strict):
    window_size: int = Field(4, ge=1, description="W")
    ngram_size: int = Field(3, ge=1, description="N")
    verification_set_size: int = Field(4, ge=1, description="G")

    def max_draft_len(self) -> int:
        """The engine's max_draft_len for this (W, N, G) (upstream-facts: trtllm-lookahead-max-draft-len)."""
        w, n, g = self.window_size, self.ngram_size, self.verification_set_size
        return (0 if n == 1 else n - 2) + (w - 1 + g) * (n - 1)


class SuffixCacheSpec(_Strict):
    """The suffix proposer's cross-request cache of earlier requests' prompt + output, per BLS instance."""

    scope: CacheScope = Field(
        CacheScope(defaults.SUFFIX_CACHE_SCOPE),
        description="who shares the cache: off, tenant (one store per tenant: the BLS's tenant input, OpenAI's user; "
        "a request without one neither reads nor writes it), or deployment (one store for every request)",
    )
    max_tokens: int = Field(
        defaults.SUFFIX_CACHE_MAX_TOKENS, ge=1, description="tokens per store (one per tenant), oldest evicted first"
    )
    max_sequences: int = Field(
        defaults.SUFFIX_CACHE_MAX_SEQUENCES, ge=1, description="finished requests per store, oldest evicted first"
    )
    max_tenants: int = Field(
        defaults.SUFFIX_CACHE_MAX_TENANTS,
        ge=1,
        description="scope tenant: tenant stores kept; the least recently used tenant's store is dropped for a new one",
    )
    min_match: int = Field(
        defaults.SUFFIX_CACHE_MIN_MATCH,
        ge=1,
        le=32,
        description="tokens an earlier request's text must match before it is proposed (the request's own text: 1)",
    )


class Speculative(_Strict):
    mode: Mode = Field(Mode.DRAFT_TARGET, description="speculative decoding mode")
    max_draft_len: int = Field(5, ge=0, description="K built into the target engine (max draft tokens per step)")
    num_draft_tokens: Optional[int] = Field(
        None, ge=0, description="default per-request k (null = max_draft_len); must be <= max_draft_len"
    )
    ngram_size: int = Field(
        3, ge=1, description="n-gram mode, prompt_lookup proposer: tokens matched at the tail of the sequence"
    )
    proposer: Proposer = Field(
        Proposer.SUFFIX,
        description="n-gram mode's draft-free proposer: suffix (longest suffix match, by frequency) or prompt_lookup",
    )
    suffix_cache: SuffixCacheSpec = Field(
        default_factory=SuffixCacheSpec, description="n-gram mode, suffix proposer: the cross-request cache"
    )
    draft_len_policy: Policy = Field(
        Policy.ADAPTIVE,
        description="draft-target / n-gram / eagle (the CPU engine's chain): adaptive k per round from measured "
        "costs and acceptance (k = 0 included), or fixed k = num_draft_tokens (eagle: max_draft_len)",
    )
    use_draft_logits: bool = Field(
        False, description="rejection sampling with draft logits (draft gathers generation logits)"
    )
    baseline_engine: bool = Field(
        True,
        description="medusa / eagle / lookahead: build a non-speculative engine of the target for the ensemble "
        "(the baseline check and bench compare against; it needs the target's weights a second time); false = no "
        "baseline, and check / bench refuse to compare",
    )
    medusa: Optional[MedusaSpec] = None

    @field_validator("draft_len_policy", mode="before")
    @classmethod
    def _loop_policy(cls, v: Any) -> Any:
        return _one_of(LOOP_POLICIES, v)

    @property
    def has_baseline_engine(self) -> bool:
        """Whether the baseline gets an engine of its own (llmapi's baseline reuses the target's checkpoint)."""
        return self.mode.in_engine and not self.mode.llmapi_only and self.baseline_engine

    eagle: Optional[EagleSpec] = None
    lookahead: Optional[LookaheadSpec] = None
    eagle3: Optional[Eagle3Spec] = None
    mtp: Optional[MtpSpec] = None

    @property
    def default_k(self) -> int:
        return self.max_draft_len if self.num_draft_tokens is None else self.num_draft_tokens


class Limits(_Strict):
    max_batch_size: int = Field(8, ge=1, description="--max_batch_size")
    max_input_len: int = Field(4096, ge=1, description="--max_input_len")
    max_seq_len: int = Field(8192, ge=2, description="--max_seq_len (prompt + output)")
    max_num_tokens: int = Field(8192, ge=1, description="--max_num_tokens (tokens per engine step)")

    @model_validator(mode="after")
    def _input_fits(self) -> "Limits":
        if self.max_input_len >= self.max_seq_len:
            raise ValueError(
                f"max_input_len ({self.max_input_len}) must be < max_seq_len ({self.max_seq_len}); "
                "raise limits.max_seq_len or lower limits.max_input_len"
            )
        return self


class Serving(_Strict):
    kv_cache_free_gpu_mem_fraction: Optional[float] = Field(
        None,
        gt=0,
        le=1,
        description="KV-cache share of free GPU memory (null = 0.9, or what leaves room for a draft sharing the GPU)",
    )
    gpu_device_ids: Optional[list[int]] = Field(None, description="target GPUs (null = 0..world-1)")
    draft_gpu_device_ids: Optional[list[int]] = Field(None, description="draft GPUs (null = the target's first GPUs)")
    memory_reserve_gib: float = Field(
        3.0, ge=0, description="per-engine per-GPU reserve for CUDA context, activations and workspace"
    )


class Toolchain(_Strict):
    """Where the TensorRT-LLM tools live (defaults match the NGC image)."""

    python: str = Field("python3", description="interpreter that runs the TensorRT-LLM example scripts")
    examples_dir: str = Field("/app/examples", description="TensorRT-LLM examples directory (NGC image: /app/examples)")
    trtllm_build: str = Field("trtllm-build", description="trtllm-build executable")
    llmapi_model_dir: str = Field(
        "",
        description="runtime llmapi: NVIDIA's LLM-API Triton model source (its "
        'model.py) in the image; "" = look in the NGC image\'s known places',
    )


class BuildConfig(_Strict):
    name: Optional[str] = Field(None, description="deployment name (null = config file stem)")
    engine: Engine = Field("tensorrt", description="tensorrt (GPU, TensorRT-LLM 1.2) or reference (CPU, PyTorch)")
    runtime: RuntimeKind = Field(
        "engine",
        description="engine (trtllm-build engines, the tensorrtllm backend, the "
        "speculative BLS) or llmapi (TensorRT-LLM's LLM API on PyTorch: no build step, "
        "speculation inside the model; EAGLE-3, MTP)",
    )
    gpu: str = Field(
        "auto",
        description="auto (nvidia-smi) or a named GPU such as h100, h200, a100-80gb, l40s; "
        'NAME:COUNT (a name without a count is labelled "an 8-GPU node assumed"; `--gpu NAME` on the '
        "command line takes this count when it names the same GPU, and otherwise must say `NAME:COUNT`)",
    )
    target: ModelSpec
    draft: Optional[DraftSpec] = None
    quantization: Quantization = Field(default_factory=Quantization)
    speculative: Speculative = Field(default_factory=Speculative)
    limits: Limits = Field(default_factory=Limits)
    serving: Serving = Field(default_factory=Serving)
    toolchain: Toolchain = Field(default_factory=Toolchain)
    output_dir: Optional[str] = Field(None, description=f"build output directory (null = {BUILD_ROOT}/<name>)")

    @model_validator(mode="before")
    @classmethod
    def _serving_section(cls, data):
        """An old `runtime:` section loads as `serving:`."""
        if isinstance(data, dict) and isinstance(data.get("runtime"), dict):
            old = data["runtime"]
            serving = data.get("serving")
            data = {**data, "serving": {**serving, **old} if isinstance(serving, dict) else old}
            del data["runtime"]  # --set runtime.X=... lands here too: merged, X wins
        return data

    @field_validator("gpu")
    @classmethod
    def _gpu_lower(cls, v: str) -> str:
        return v.strip().lower()

    @model_validator(mode="after")
    def _mode_needs(self) -> "BuildConfig":
        s = self.speculative
        if s.mode == Mode.DRAFT_TARGET and self.draft is None:
            raise ValueError(
                "speculative.mode draft_target needs a `draft:` model; add draft.checkpoint or pick mode ngram"
            )
        if s.mode != Mode.DRAFT_TARGET and self.draft is not None:
            raise ValueError(f"speculative.mode {s.mode} uses no draft model; remove `draft:` or set mode draft_target")
        if s.mode == Mode.MEDUSA and s.medusa is None:
            raise ValueError("speculative.mode medusa needs speculative.medusa.heads_dir")
        if s.mode == Mode.EAGLE and (s.eagle is None or (s.eagle.heads_dir is None) == (s.eagle.train is None)):
            raise ValueError(
                "speculative.mode eagle needs exactly one of speculative.eagle.heads_dir (a head) or "
                "speculative.eagle.train (engine: reference: train an EAGLE-3 head at build time)"
            )
        if s.eagle is not None and s.eagle.train is not None and self.engine != "reference":
            raise ValueError(
                "speculative.eagle.train is for engine: reference; trtllm-build's eagle mode loads "
                "EAGLE-1/2 heads (give speculative.eagle.heads_dir), and a trained EAGLE-3 head is served "
                "by runtime: llmapi mode eagle3 (speculative.eagle3.heads_dir)"
            )
        if s.mode == Mode.LOOKAHEAD and s.lookahead is None:
            s.lookahead = LookaheadSpec()
        try:
            recipe(self.runtime, self.engine, s.mode)
        except RecipeError as e:
            if e.fix == "runtime":  # engine refusals are preflight's, after the model checks
                raise ValueError(str(e)) from None
        if s.mode == Mode.EAGLE3 and s.eagle3 is None:
            raise ValueError(
                "speculative.mode eagle3 needs speculative.eagle3.heads_dir (an EAGLE-3 head for the target)"
            )
        if s.mode == Mode.MTP and s.mtp is None:
            s.mtp = MtpSpec()
        return self

    @property
    def recipe(self) -> Recipe:
        """This config's recipe row, refused or not (preflight raises the refusal)."""
        return RECIPES[(self.runtime, self.engine, self.speculative.mode)]

    def resolved_name(self, source: Path | None) -> str:
        return self.name or (source.stem if source else "trt-spec")

    def resolved_output_dir(self, source: Path | None) -> Path:
        return Path(self.output_dir) if self.output_dir else Path(BUILD_ROOT) / self.resolved_name(source)

    def canonical_json(self) -> str:
        return json.dumps(self.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))

    def config_hash(self) -> str:
        return hashlib.sha256(self.canonical_json().encode()).hexdigest()[:16]


# -- Loading


def _fmt_loc(loc: tuple[Any, ...]) -> str:
    return ".".join(str(p) for p in loc if not (isinstance(p, str) and p.startswith("function-after")))


def _valid_keys(model: type[BaseModel], loc: tuple[Any, ...]) -> list[str]:
    """Field names valid at the parent of `loc`."""
    cur: Any = model
    for part in loc[:-1]:
        fields = getattr(cur, "model_fields", None)
        if not fields or part not in fields:
            return []
        ann = fields[part].annotation
        args = getattr(ann, "__args__", None)
        if args:
            ann = next((a for a in args if isinstance(a, type) and issubclass(a, BaseModel)), ann)
        cur = ann
    fields = getattr(cur, "model_fields", None)
    return sorted(fields) if fields else []


def format_validation_error(err: ValidationError, source: str) -> str:
    """First error only, one line: `<source>: <key.path>: <problem>; <what is valid>`."""
    e = err.errors()[0]
    loc = _fmt_loc(e["loc"])
    where = f"{source}: {loc}" if loc else source
    if e["type"] == "extra_forbidden":
        valid = _valid_keys(BuildConfig, e["loc"])
        return f"{where}: unknown key; valid keys here: {', '.join(valid)}"
    if e["type"] == "missing":
        return f"{where}: required key is missing"
    msg = e["msg"]
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, ") :]
    got = e.get("input")
    if e["type"] in (
        "literal_error",
        "enum",
        "int_parsing",
        "float_parsing",
        "bool_parsing",
        "int_type",
        "string_type",
        "greater_than_equal",
        "greater_than",
        "less_than_equal",
        "list_type",
        "dict_type",
        "model_type",
    ):
        msg = f"{msg} (got {got!r})"
    extra = f" ({len(err.errors()) - 1} more error(s) after fixing this one)" if len(err.errors()) > 1 else ""
    return f"{where}: {msg}{extra}"


def _parse_scalar(text: str) -> Any:
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def apply_override(data: dict, dotted: str, value: Any) -> None:
    """Set data[a][b][c] = value for 'a.b.c', creating dicts on the way."""
    parts = [p for p in dotted.split(".") if p]
    if not parts:
        raise ConfigError(f"--set {dotted!r}: empty key; use --set section.key=value")
    cur = data
    for p in parts[:-1]:
        nxt = cur.get(p)
        if nxt is None:
            nxt = cur[p] = {}
        if not isinstance(nxt, dict):
            raise ConfigError(f"--set {dotted}: {p} is a value, not a section")
        cur = nxt
    cur[parts[-1]] = value


def parse_set_items(items: list[str] | tuple[str, ...]) -> list[tuple[str, Any]]:
    out = []
    for item in items:
        if "=" not in item:
            raise ConfigError(f"--set {item!r}: expected key=value, e.g. --set target.checkpoint=/models/llama")
        k, v = item.split("=", 1)
        out.append((k.strip(), _parse_scalar(v)))
    return out


def env_overrides(environ: dict[str, str] | None = None) -> list[tuple[str, Any]]:
    environ = os.environ if environ is None else environ
    out = []
    for k, v in sorted(environ.items()):
        if k.startswith(ENV_PREFIX) and len(k) > len(ENV_PREFIX):
            out.append((k[len(ENV_PREFIX) :].lower().replace("__", "."), _parse_scalar(v)))
    return out


def load_config(
    path: str | Path,
    overrides: list[str] | tuple[str, ...] = (),
    environ: dict[str, str] | None = None,
) -> BuildConfig:
    """Read, override and validate a build config. Raises ConfigError with one clear line."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"{p}: config file not found; pick one from build_configs/ (ls build_configs)")
    try:
        data = yaml.safe_load(p.read_text()) or {}
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" line {mark.line + 1} column {mark.column + 1}" if mark else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ConfigError(f"{p}:{where}: invalid YAML: {problem}; fix the syntax") from None
    if not isinstance(data, dict):
        raise ConfigError(
            f"{p}: top level must be a mapping of keys (target:, speculative:, ...), got {type(data).__name__}"
        )
    for key, value in env_overrides(environ) + parse_set_items(overrides):
        apply_override(data, key, value)
    try:
        return BuildConfig.model_validate(data)
    except ValidationError as e:
        raise ConfigError(format_validation_error(e, str(p))) from None


def defaults_table() -> list[tuple[str, Any, str]]:
    """(key path, default, description) for every field."""
    rows: list[tuple[str, Any, str]] = []

    def walk(model: type[BaseModel], prefix: str) -> None:
        for name, f in model.model_fields.items():
            ann = f.annotation
            args = getattr(ann, "__args__", ())
            sub = next((a for a in (ann, *args) if isinstance(a, type) and issubclass(a, BaseModel)), None)
            key = f"{prefix}{name}"
            if sub is not None:
                walk(sub, key + ".")
            else:
                default = None if f.is_required() else f.get_default(call_default_factory=True)
                rows.append((key, "(required)" if f.is_required() else default, f.description or ""))

    walk(BuildConfig, "")
    return rows


def markdown_table() -> str:
    """docs/configs.md's table of keys and defaults."""
    rows = [f"| `{k}` | `{v}` | {d} |" for k, v, d in defaults_table()]
    return "\n".join(["| key | default | meaning |", "|---|---|---|", *rows])


if __name__ == "__main__":  # pragma: no cover
    print(markdown_table())
