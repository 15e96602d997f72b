"""Triton model repository writer for runtime engine: a build manifest -> NVIDIA-named models (preprocessing,
tensorrt_llm[_draft], postprocessing, the `ensemble` baseline, the speculative `tensorrt_llm_bls`), validated back.

Models are decoupled (streaming) by default; decoupled=False writes NVIDIA's unary DTM variant
(upstream-facts: trtllm-dtm-recipe-unary). Both engines share one config path; only `backend` differs (GPU or CPU).
ABSOLUTE_PATHS: model paths are absolute so any launcher works from any directory
(upstream-facts: tensorrtllm-model-path-cwd). Engines are verified against their build checksums before writing.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Optional

from tritonclient.grpc import model_config_pb2 as mc

from ..records import backend_contract as bc
from ..records.bls_parameters import BlsParameters, PreprocessingParameters
from ..records.deployment import Deployment
from ..records.integrity import IntegrityError, rebuild_hint, verify
from ..records.manifest import BuildManifest, EngineEntry, RepoRecord
from ..records.memory import SHARING_ROLES
from ..records.names import (
    ACCEPTED_LENGTH_HISTOGRAM,
    BAD_WORDS,
    BASELINE_ENGINE,
    BEAM_WIDTH,
    BLS,
    CACHE_ACCEPTED_TOKENS,
    DRAFT,
    DRAFT_LEN_POLICY,
    DRAFT_LENGTHS,
    EMBEDDING_BIAS,
    ENGINE_MODELS,
    ENSEMBLE,
    MAX_TOKENS,
    NUM_DRAFT_TOKENS,
    NUM_RETURN_SEQUENCES,
    OUTPUT_IDS,
    POST_OUTPUT_IDS,
    PROFILE,
    RETURN_PROFILE,
    SEQUENCE_LENGTH,
    STOP_WORDS,
    STREAM,
    TARGET,
    TENANT,
    TEXT_INPUT,
    TEXT_OUTPUT,
    TOP_K,
    TOP_P,
    TOTAL_STEPS,
    USE_DRAFT_LOGITS,
    Post,
    Pre,
)
from ..records.names import (
    POSTPROCESSING as POST,
)
from ..records.names import (
    PREPROCESSING as PRE,
)
from ..records.speculation import Mode, Runtime
from . import llmapi as lr
from .common import (
    RepoPlan,
    RepositoryError,
    model_repo_sources,
    parse_config,
    write_config,  # noqa: F401
    write_planned,
)

if TYPE_CHECKING:
    pass

LOGITS_TYPE = bc.LOGITS_TYPE


T = mc.DataType.Value


def _io(
    cls,
    name: str,
    dtype: str,
    dims: list[int],
    *,
    optional: bool = False,
    ragged: bool = False,
    reshape: Optional[list[int]] = None,
):
    m = cls(name=name, data_type=T(dtype), dims=dims)
    if cls is mc.ModelInput:
        m.optional = optional
        m.allow_ragged_batch = ragged
    if reshape is not None:
        m.reshape.shape.extend(reshape)
    return m


def inp(*a, **k):
    return _io(mc.ModelInput, *a, **k)


def out(name: str, dtype: str, dims: list[int]):
    return _io(mc.ModelOutput, name, dtype, dims)


def _params(cfg: mc.ModelConfig, params: dict[str, object]) -> None:
    for k, v in params.items():
        if v is None:
            continue
        if isinstance(v, bool):
            v = "true" if v else "false"
        cfg.parameters[k].string_value = str(v)


def _spec(t: bc.TensorSpec, cls):
    if cls is mc.ModelOutput:
        return out(t.name, t.dtype, list(t.dims))
    return inp(t.name, t.dtype, list(t.dims), optional=t.optional, ragged=t.ragged, reshape=[] if t.scalar else None)


def engine_inputs() -> list:
    return [_spec(t, mc.ModelInput) for t in bc.INPUTS]


def engine_outputs() -> list:
    return [_spec(t, mc.ModelOutput) for t in bc.OUTPUTS]


@dataclass(frozen=True)
class RepoOptions:
    """decoupled=False: NVIDIA's unary DTM variant; max_queue_size 0: unbounded."""

    decoupled: bool = True
    max_queue_size: int = 0


def served_input_len(d: Deployment) -> int:
    """The longest prompt served: limits.max_input_len, capped by what the engine takes."""
    lim = d.limits
    return min(lim.max_input_len, bc.max_input_len(lim.max_seq_len, lim.max_num_tokens))


def orchestrator(engines: dict[str, EngineEntry]) -> bool:
    """Two TensorRT-LLM models with TP/PP > 1: the backend's orchestrator mode spawns their ranks."""
    return any(e.world_size > 1 for e in engines.values()) and len(engines) > 1


def engine_config(name: str, role: str, d: Deployment, e: EngineEntry, o: RepoOptions) -> mc.ModelConfig:
    """A `tensorrt_llm` model: identical for both engines but for `backend`."""
    sp, pl = d.speculation, d.placement
    cfg = mc.ModelConfig(name=name, max_batch_size=d.limits.max_batch_size)
    cfg.model_transaction_policy.decoupled = o.decoupled
    cfg.input.extend(engine_inputs())
    cfg.output.extend(engine_outputs())
    cfg.instance_group.add(count=1, kind=mc.ModelInstanceGroup.KIND_CPU)
    cfg.dynamic_batching.max_queue_delay_microseconds = 0
    if o.max_queue_size > 0:  # upstream-facts: contract-queue-full
        cfg.dynamic_batching.default_queue_policy.max_queue_size = o.max_queue_size
    cfg.backend = d.recipe.backend
    params: dict[str, object] = {
        "gpt_model_type": "inflight_fused_batching",
        "gpt_model_path": os.path.abspath(e.dir),  # ABSOLUTE_PATHS
        "max_beam_width": 1,
        "enable_kv_cache_reuse": True,  # upstream-facts: trtllm-spec-needs-kv-reuse
        "enable_chunked_context": False,  # input limit: upstream-facts: executor-max-input-len
        bc.EXCLUDE_INPUT_IN_OUTPUT: False,
        "kv_cache_free_gpu_mem_fraction": pl.kv_cache_free_gpu_mem_fraction,
        "max_tokens_in_paged_kv_cache": pl.draft_max_tokens_in_paged_kv_cache if role in SHARING_ROLES else None,
        "gpu_device_ids": ",".join(str(g) for g in e.devices) or None,
        "batch_scheduler_policy": "guaranteed_no_evict",
        # required by the backend (upstream-facts: contract-required-parameters, contract-guided-decoding-off)
        "tokenizer_dir": d.tokenizer_dir,
        "xgrammar_tokenizer_info_path": bc.GUIDED_DECODING_OFF,
        "guided_decoding_backend": bc.GUIDED_DECODING_OFF,
    }
    match sp.mode if role == "target" else None:
        case Mode.MEDUSA:
            params["decoding_mode"] = "medusa"
            params["medusa_choices"] = _choices(sp.medusa_choices)
        case Mode.EAGLE:
            params["decoding_mode"] = "eagle"
            params["eagle_choices"] = _choices(sp.eagle_choices)
        case Mode.LOOKAHEAD:
            la = sp.lookahead
            params.update(
                decoding_mode="lookahead",
                lookahead_window_size=la.window_size,
                lookahead_ngram_size=la.ngram_size,
                lookahead_verification_set_size=la.verification_set_size,
            )
    _params(cfg, params)
    return cfg


def _choices(choices: Optional[list]) -> Optional[str]:
    # Triton's string form "{0}, {0, 0}, {1}"; None = the backend's default tree
    if not choices:
        return None
    return ", ".join("{" + ", ".join(str(x) for x in c) + "}" for c in choices)


def preprocessing_config(d: Deployment) -> mc.ModelConfig:
    cfg = mc.ModelConfig(name=PRE, backend="python", max_batch_size=d.limits.max_batch_size)
    cfg.input.extend(
        [
            inp(Pre.QUERY, "TYPE_STRING", [1]),
            inp(Pre.REQUEST_OUTPUT_LEN, "TYPE_INT32", [1]),
            inp(Pre.BAD_WORDS, "TYPE_STRING", [-1], optional=True),
            inp(Pre.STOP_WORDS, "TYPE_STRING", [-1], optional=True),
            inp(Pre.END_ID, "TYPE_INT32", [1], optional=True),
            inp(Pre.PAD_ID, "TYPE_INT32", [1], optional=True),
            *embedding_bias_inputs(Pre.EMBEDDING_BIAS[0], Pre.EMBEDDING_BIAS[1]),
        ]
    )
    cfg.output.extend(
        [
            out(Pre.INPUT_ID, "TYPE_INT32", [-1]),
            out(Pre.DECODER_INPUT_ID, "TYPE_INT32", [-1]),  # upstream-facts: contract-decoder-input-ids
            out(Pre.REQUEST_INPUT_LEN, "TYPE_INT32", [1]),
            out(Pre.REQUEST_OUTPUT_LEN, "TYPE_INT32", [1]),
            out(Pre.BAD_WORDS_IDS, "TYPE_INT32", [2, -1]),
            out(Pre.STOP_WORDS_IDS, "TYPE_INT32", [2, -1]),
            out(Pre.OUT_END_ID, "TYPE_INT32", [1]),
            out(Pre.OUT_PAD_ID, "TYPE_INT32", [1]),
        ]
    )
    cfg.instance_group.add(count=1, kind=mc.ModelInstanceGroup.KIND_CPU)
    _params(
        cfg, PreprocessingParameters(tokenizer_dir=d.tokenizer_dir, max_input_len=served_input_len(d)).to_parameters()
    )
    return cfg


def postprocessing_config(d: Deployment) -> mc.ModelConfig:
    cfg = mc.ModelConfig(name=POST, backend="python", max_batch_size=d.limits.max_batch_size)
    cfg.input.extend([inp(Post.TOKENS_BATCH, "TYPE_INT32", [-1, -1]), inp(Post.SEQUENCE_LENGTH, "TYPE_INT32", [-1])])
    # OUTPUT: NVIDIA's, one string per sequence and beam; OUTPUT_IDS: the token ids cut to their length
    cfg.output.extend([out(Post.OUTPUT, "TYPE_STRING", [-1]), out(POST_OUTPUT_IDS, "TYPE_INT32", [-1, -1])])
    cfg.instance_group.add(count=1, kind=mc.ModelInstanceGroup.KIND_CPU)
    _params(cfg, {"tokenizer_dir": d.tokenizer_dir, "skip_special_tokens": True})
    return cfg


def embedding_bias_inputs(words: str, weights: str) -> list:
    """Declared so NVIDIA's clients are served (upstream-facts: trtllm-clients-empty-embedding-bias); a non-empty
    bias is refused."""
    return [inp(words, "TYPE_STRING", [-1], optional=True), inp(weights, "TYPE_FP32", [-1], optional=True)]


def text_inputs(bls: bool) -> list:
    ins = [
        inp(TEXT_INPUT, "TYPE_STRING", [1]),
        inp(MAX_TOKENS, "TYPE_INT32", [1]),
        inp(BAD_WORDS, "TYPE_STRING", [-1], optional=True),
        inp(STOP_WORDS, "TYPE_STRING", [-1], optional=True),
        inp(bc.END_ID, "TYPE_INT32", [1], optional=True),
        inp(bc.PAD_ID, "TYPE_INT32", [1], optional=True),
        inp(TOP_K, "TYPE_INT32", [1], optional=True),
        inp(TOP_P, "TYPE_FP32", [1], optional=True),
        inp(bc.TEMPERATURE, "TYPE_FP32", [1], optional=True),
        inp(bc.SEED, "TYPE_UINT64", [1], optional=True),
        inp(STREAM, "TYPE_BOOL", [1], optional=True),
        inp(bc.EXCLUDE_INPUT_IN_OUTPUT, "TYPE_BOOL", [1], optional=True),
        inp(bc.RETURN_PERF_METRICS, "TYPE_BOOL", [1], optional=True),
        # 1 is the only value served (upstream-facts: e2e-client-beam-width)
        inp(BEAM_WIDTH, "TYPE_INT32", [1], optional=True),
        inp(NUM_RETURN_SEQUENCES, "TYPE_INT32", [1], optional=True),
        *embedding_bias_inputs(*EMBEDDING_BIAS),
    ]
    if bls:
        ins += [
            inp(NUM_DRAFT_TOKENS, "TYPE_INT32", [1], optional=True),
            inp(USE_DRAFT_LOGITS, "TYPE_BOOL", [1], optional=True),
            inp(DRAFT_LEN_POLICY, "TYPE_STRING", [1], optional=True),
            inp(TENANT, "TYPE_STRING", [1], optional=True),  # the suffix cache's scope
            inp(RETURN_PROFILE, "TYPE_BOOL", [1], optional=True),  # bench --profile: where the time went
        ]
    return ins


def ensemble_config(d: Deployment, baseline_engine: bool) -> mc.ModelConfig:
    cfg = mc.ModelConfig(name=ENSEMBLE, platform="ensemble", max_batch_size=d.limits.max_batch_size)
    cfg.input.extend(text_inputs(bls=False))
    cfg.output.extend(
        [
            out(TEXT_OUTPUT, "TYPE_STRING", [-1]),
            out(OUTPUT_IDS, "TYPE_INT32", [-1, -1]),
            *(_spec(t, mc.ModelOutput) for t in bc.OUTPUTS if t.name in bc.PERF_OUTPUTS),
        ]
    )
    steps = cfg.ensemble_scheduling.step
    pre = steps.add(model_name=PRE, model_version=-1)
    pre.input_map.update(
        {
            Pre.QUERY: TEXT_INPUT,
            Pre.REQUEST_OUTPUT_LEN: MAX_TOKENS,
            Pre.BAD_WORDS: BAD_WORDS,
            Pre.STOP_WORDS: STOP_WORDS,
            Pre.END_ID: bc.END_ID,
            Pre.PAD_ID: bc.PAD_ID,
            Pre.EMBEDDING_BIAS[0]: EMBEDDING_BIAS[0],
            Pre.EMBEDDING_BIAS[1]: EMBEDDING_BIAS[1],
        }
    )
    pre.output_map.update(
        {
            Pre.INPUT_ID: "_INPUT_ID",
            Pre.REQUEST_INPUT_LEN: "_REQUEST_INPUT_LEN",
            Pre.REQUEST_OUTPUT_LEN: "_REQUEST_OUTPUT_LEN",
            Pre.BAD_WORDS_IDS: "_BAD_WORDS_IDS",
            Pre.STOP_WORDS_IDS: "_STOP_WORDS_IDS",
            Pre.OUT_END_ID: "_END_ID",
            Pre.OUT_PAD_ID: "_PAD_ID",
        }
    )
    # in-engine modes' target always speculates: the baseline uses the plain engine built beside it
    llm = steps.add(model_name=BASELINE_ENGINE if baseline_engine else TARGET, model_version=-1)
    llm.input_map.update(
        {
            bc.INPUT_IDS: "_INPUT_ID",
            bc.INPUT_LENGTHS: "_REQUEST_INPUT_LEN",
            bc.REQUEST_OUTPUT_LEN: "_REQUEST_OUTPUT_LEN",
            bc.END_ID: "_END_ID",
            bc.PAD_ID: "_PAD_ID",
            bc.BAD_WORDS_LIST: "_BAD_WORDS_IDS",
            bc.STOP_WORDS_LIST: "_STOP_WORDS_IDS",
            bc.RUNTIME_TOP_K: TOP_K,
            bc.RUNTIME_TOP_P: TOP_P,
            bc.TEMPERATURE: bc.TEMPERATURE,
            bc.SEED: bc.SEED,
            bc.STREAMING: STREAM,
            bc.EXCLUDE_INPUT_IN_OUTPUT: bc.EXCLUDE_INPUT_IN_OUTPUT,
            bc.RETURN_PERF_METRICS: bc.RETURN_PERF_METRICS,
            BEAM_WIDTH: BEAM_WIDTH,
            NUM_RETURN_SEQUENCES: NUM_RETURN_SEQUENCES,
        }
    )
    # internal tensors, never ensemble outputs (upstream-facts: triton-ensemble-pruning)
    llm.output_map.update(
        {OUTPUT_IDS: "_TOKENS_BATCH", SEQUENCE_LENGTH: "_SEQUENCE_LENGTH", **{name: name for name in bc.PERF_OUTPUTS}}
    )
    post = steps.add(model_name=POST, model_version=-1)
    post.input_map.update({Post.TOKENS_BATCH: "_TOKENS_BATCH", Post.SEQUENCE_LENGTH: "_SEQUENCE_LENGTH"})
    post.output_map.update({Post.OUTPUT: TEXT_OUTPUT, POST_OUTPUT_IDS: OUTPUT_IDS})
    return cfg


def bls_config(d: Deployment, decoupled: bool) -> mc.ModelConfig:
    cfg = mc.ModelConfig(name=BLS, backend="python", max_batch_size=d.limits.max_batch_size)
    cfg.model_transaction_policy.decoupled = decoupled
    cfg.input.extend(text_inputs(bls=True))
    cfg.output.extend(
        [
            out(TEXT_OUTPUT, "TYPE_STRING", [-1]),
            out(OUTPUT_IDS, "TYPE_INT32", [-1]),
            # summed over rounds (upstream-facts: e2e-client-perf-metrics, triton-undeclared-output)
            *(_spec(t, mc.ModelOutput) for t in bc.OUTPUTS if t.name in bc.PERF_OUTPUTS),
            out(TOTAL_STEPS, "TYPE_INT32", [1]),
            out(CACHE_ACCEPTED_TOKENS, "TYPE_INT32", [1]),
            out(ACCEPTED_LENGTH_HISTOGRAM, "TYPE_INT32", [-1]),
            out(DRAFT_LENGTHS, "TYPE_INT32", [-1]),
            out(PROFILE, "TYPE_STRING", [1]),  # sent only when the request sets return_profile
        ]
    )
    cfg.instance_group.add(count=1, kind=mc.ModelInstanceGroup.KIND_CPU)
    _params(cfg, bls_parameters(d).to_parameters())
    return cfg


def bls_parameters(d: Deployment) -> BlsParameters:
    """The BLS's parameters block."""
    sp = d.speculation
    return BlsParameters(
        tensorrt_llm_model_name=TARGET,
        tensorrt_llm_draft_model_name=DRAFT if sp.mode is Mode.DRAFT_TARGET else "",
        speculative_mode=sp.mode.bls_mode,
        max_draft_len=sp.max_draft_len,
        num_draft_tokens=sp.num_draft_tokens,
        ngram_size=sp.ngram_size,
        draft_len_policy=sp.draft_len_policy,
        proposer=sp.proposer,
        max_seq_len=d.limits.max_seq_len,
        max_num_tokens=d.limits.max_num_tokens,
        max_input_len=served_input_len(d),
        tokenizer_dir=d.tokenizer_dir,
        suffix_cache=sp.suffix_cache,
    )


def mpi_ranks(d: Deployment, engines: dict[str, EngineEntry]) -> int:
    """tritonserver processes under mpirun: one per rank of a single multi-GPU engine, else 1 (orchestrator mode
    spawns its own ranks)."""
    if d.recipe.launcher != "mpirun" or orchestrator(engines):
        return 1
    return max(e.world_size for e in engines.values())


def repository_configs(
    d: Deployment, engines: dict[str, EngineEntry], o: RepoOptions = RepoOptions()
) -> dict[str, mc.ModelConfig]:
    models = {PRE: preprocessing_config(d), POST: postprocessing_config(d)}
    for name, role in ((TARGET, "target"), (DRAFT, "draft"), (BASELINE_ENGINE, "baseline")):
        if role in engines:
            models[name] = engine_config(name, role, d, engines[role], o)
    models[ENSEMBLE] = ensemble_config(d, "baseline" in engines)
    models[BLS] = bls_config(d, o.decoupled)
    return models


def validate_repository(repo: Path, *, require_sources: bool = True) -> dict[str, mc.ModelConfig]:
    """Parse every config.pbtxt back and check cross-model references; RepositoryError. require_sources=False: an
    LLM-API model may lack NVIDIA's model.py."""
    repo = Path(repo)
    models: dict[str, mc.ModelConfig] = {}
    llmapi_names: set[str] = set()
    for cfg_path in sorted(repo.glob("*/config.pbtxt")):
        cfg = parse_config(cfg_path)
        if cfg.name != cfg_path.parent.name:
            raise RepositoryError(f"{cfg_path}: name {cfg.name!r} differs from its directory {cfg_path.parent.name!r}")
        llmapi = (cfg_path.parent / "1" / "model.yaml").is_file()
        if cfg.backend == "python" and not llmapi and not (cfg_path.parent / "1" / "model.py").is_file():
            raise RepositoryError(f"{cfg.name}: python backend model without 1/model.py")
        models[cfg.name] = cfg
        if llmapi:
            llmapi_names.add(cfg.name)
    if not models:
        raise RepositoryError(f"{repo}: no models (no */config.pbtxt); run trt-spec repo")
    try:
        lr.validate(repo, models, require_source=require_sources)
    except lr.LlmapiRepositoryError as e:
        raise RepositoryError(str(e)) from None
    for name, cfg in models.items():
        if name in ENGINE_MODELS and name not in llmapi_names:
            try:  # what the tensorrtllm backend checks at load
                bc.check_parameters({k: v.string_value for k, v in cfg.parameters.items()})
            except bc.ContractError as e:
                raise RepositoryError(
                    f"{name}: the tensorrtllm backend would refuse to load it: {e}; regenerate with trt-spec repo"
                ) from None
        if cfg.platform == "ensemble":
            _check_ensemble(cfg, models)
        for key in ("tensorrt_llm_model_name", "tensorrt_llm_draft_model_name"):
            ref = cfg.parameters[key].string_value if key in cfg.parameters else ""
            if ref and ref not in models:
                raise RepositoryError(f"{name}: parameter {key} names model {ref!r}, which is not in the repository")
            if ref:
                _check_engine_interface(name, models[ref])
    return models


def _check_engine_interface(caller: str, engine: mc.ModelConfig) -> None:
    have_in = {i.name for i in engine.input}
    have_out = {o.name for o in engine.output}
    for t in (bc.INPUT_IDS, bc.INPUT_LENGTHS, bc.REQUEST_OUTPUT_LEN, bc.DRAFT_INPUT_IDS):
        if t not in have_in:
            raise RepositoryError(f"{caller} calls {engine.name}, which has no input {t!r}")
    for t in bc.MANDATORY_OUTPUTS:
        if t not in have_out:
            raise RepositoryError(f"{caller} calls {engine.name}, which has no output {t!r}")


def pruned_steps(cfg: mc.ModelConfig, requested: set[str]) -> set[int]:
    """The steps Triton's ensemble scheduler prunes for a request that asks for `requested`, reproduced as upstream
    does it (upstream-facts: triton-ensemble-pruning)."""
    steps = list(cfg.ensemble_scheduling.step)
    producer = {t: i for i, st in enumerate(steps) for t in st.output_map.values()}
    consumers: dict[str, set[int]] = {}
    for i, st in enumerate(steps):
        for t in st.input_map.values():
            consumers.setdefault(t, set()).add(i)
    ignored = {o.name for o in cfg.output} - set(requested)
    left: dict[int, int] = {}
    pruned: set[int] = set()
    while ignored:
        newly: set[str] = set()
        for t in ignored:
            i = producer.get(t, 0)
            left[i] = left.get(i, len(steps[i].output_map)) - 1
            if left[i] == 0:
                pruned.add(i)
                for t_in in steps[i].input_map.values():
                    consumers[t_in].discard(i)
                    if not consumers[t_in]:
                        newly.add(t_in)
        ignored = newly
    return pruned


def _needed_steps(cfg: mc.ModelConfig, output: str) -> set[int]:
    """The steps an ensemble output is computed through, transitively."""
    steps = list(cfg.ensemble_scheduling.step)
    producer = {t: i for i, st in enumerate(steps) for t in st.output_map.values()}
    need, todo = set(), [output]
    while todo:
        i = producer.get(todo.pop())
        if i is not None and i not in need:
            need.add(i)
            todo += list(steps[i].input_map.values())
    return need


def _check_ensemble(cfg: mc.ModelConfig, models: dict[str, mc.ModelConfig]) -> None:
    available = {i.name for i in cfg.input}
    for step in cfg.ensemble_scheduling.step:
        m = models.get(step.model_name)
        if m is None:
            raise RepositoryError(f"{cfg.name}: step model {step.model_name!r} is not in the repository")
        m_in, m_out = {i.name for i in m.input}, {o.name for o in m.output}
        for model_tensor, ens_tensor in step.input_map.items():
            if model_tensor not in m_in:
                raise RepositoryError(f"{cfg.name}: step {step.model_name} maps unknown input {model_tensor!r}")
            if ens_tensor not in available:
                raise RepositoryError(
                    f"{cfg.name}: step {step.model_name} reads {ens_tensor!r}, which no earlier "
                    "step or ensemble input provides"
                )
        required = {i.name for i in m.input if not i.optional}
        missing = required - set(step.input_map)
        if missing:
            raise RepositoryError(
                f"{cfg.name}: step {step.model_name} leaves required input(s) {sorted(missing)} unmapped"
            )
        for model_tensor, ens_tensor in step.output_map.items():
            if model_tensor not in m_out:
                raise RepositoryError(f"{cfg.name}: step {step.model_name} maps unknown output {model_tensor!r}")
            available.add(ens_tensor)
    for o in cfg.output:
        if o.name not in available:
            raise RepositoryError(f"{cfg.name}: output {o.name!r} is produced by no step")
    steps = list(cfg.ensemble_scheduling.step)
    for o in cfg.output:  # a client may ask for any one output alone
        lost = _needed_steps(cfg, o.name) & pruned_steps(cfg, {o.name})
        if lost:
            raise RepositoryError(
                f"{cfg.name}: a request for {o.name!r} alone loses step {steps[max(lost)].model_name}: "
                "Triton's ensemble scheduler prunes a step once every ensemble output it maps is unrequested, even "
                'when a later step reads them; map its outputs to internal tensors ("_NAME") instead'
            )


def _python_sources(name: str) -> Path:
    """A python-backend model's shipped source (engine models: the reference engine's)."""
    return model_repo_sources() / {n: "reference_engine" for n in ENGINE_MODELS}.get(name, name) / "1"


def verify_engines(manifest: BuildManifest) -> None:
    """Every engine against the checksums its build recorded; RepositoryError."""
    for d, entry in manifest.engine_sums().items():
        try:
            verify(Path(d), entry.files, rebuild_hint(entry.config_path, entry.step) + ", then rerun trt-spec repo")
        except IntegrityError as e:
            raise RepositoryError(str(e)) from None


def write_repository(
    manifest: BuildManifest, dest: Path, *, decoupled: bool = True, max_queue_size: int = 0
) -> dict[str, mc.ModelConfig]:
    """Write the repository atomically with the manifest's runtime writer; safe to rerun. max_queue_size > 0 bounds
    the requests waiting for an engine slot."""
    if max_queue_size < 0:
        raise RepositoryError(f"max_queue_size must be >= 0 (0 = unbounded), got {max_queue_size}")
    if manifest.deployment.runtime is Runtime.LLMAPI:
        plan = lr.repo_plan(manifest, decoupled)
    else:
        plan = engine_repo_plan(manifest, RepoOptions(decoupled, max_queue_size))
    return write_planned(manifest, plan, dest, validate_repository)


def engine_repo_plan(manifest: BuildManifest, o: RepoOptions) -> RepoPlan:
    """The runtime engine repository's plan."""
    verify_engines(manifest)
    configs = repository_configs(manifest.deployment, manifest.engines, o)

    def write(root: Path) -> None:
        for name, cfg in configs.items():
            write_config(root / name, cfg)
            if cfg.backend == "python":
                for f in _python_sources(name).glob("*.py"):
                    shutil.copy2(f, root / name / "1" / f.name)

    return RepoPlan(configs, repo_record(manifest, o.decoupled, configs), write)


def repo_record(
    manifest: BuildManifest,
    decoupled: bool = True,
    configs: Optional[dict[str, mc.ModelConfig]] = None,
) -> RepoRecord:
    """The repository's record (how to launch it, its models, the engines' sums). Pure, so a repository not yet
    written (the Kubernetes chart's) gets its launch line too."""
    if manifest.deployment.runtime is Runtime.LLMAPI:
        return lr.record(manifest, decoupled, configs if configs is not None else lr.llmapi_models(manifest, decoupled))
    d, engines = manifest.deployment, manifest.engines
    configs = configs if configs is not None else repository_configs(d, engines, RepoOptions(decoupled))
    return RepoRecord(
        name=manifest.name,
        config_hash=manifest.config_hash,
        deployment=d,
        orchestrator=orchestrator(engines),
        mpi_ranks=mpi_ranks(d, engines),
        models=sorted(configs),
        decoupled=decoupled,
        gpu_ids=sorted({g for e in engines.values() for g in e.devices}),
        engines=manifest.engine_sums(),
    )
