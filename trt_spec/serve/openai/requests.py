"""The OpenAI frontend's requests: what a body may hold, its checks, and the text model's tensors it becomes.

Every check runs before any model work, against the deployment's own limits, and a bad request is one OpenAIError
naming the field and the fix. OpenAI's `user` is the speculative model's `tenant` (its suffix cache's scope).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import numpy as np

from ...errors import TrtSpecError
from ...in_triton.serving import input_byte_limit
from ...records import backend_contract as bc
from ...records import llmapi_contract as lc
from ...records.defaults import ADD_SPECIAL_TOKENS, OPENAI_MAX_CONTENT_PARTS, OPENAI_MAX_MESSAGES, TENANT_MAX_BYTES
from ...records.names import (
    BASELINE,
    DRAFT_LEN_POLICY,
    MAX_TOKENS,
    NUM_DRAFT_TOKENS,
    SPECULATIVE,
    STOP_WORDS,
    STREAM,
    TENANT,
    TEXT_INPUT,
    TEXT_MODELS,
    TOP_P,
)
from ...records.recipes import RUNTIMES
from ...records.speculation import POLICIES

ENGINE_RUNTIME, LLMAPI_RUNTIME = RUNTIMES

MAX_STOP_SEQUENCES = 4  # OpenAI's limit
METADATA_MAX_KEYS, METADATA_KEY_CHARS, METADATA_VALUE_CHARS = 16, 64, 512  # OpenAI's limits on `metadata`
IGNORED_FIELDS = {
    "metadata",
    "store",
    "service_tier",
    "parallel_tool_calls",
    "prompt_cache_key",
    "safety_identifier",
}
# refused unless at their default
UNSUPPORTED = {
    "logprobs": (None, False),
    "top_logprobs": (None, 0),
    "echo": (None, False),
    "best_of": (None, 1),
    "logit_bias": (None, {}),
    "presence_penalty": (None, 0, 0.0),
    "frequency_penalty": (None, 0, 0.0),
    "suffix": (None, ""),
    "tools": (None, []),
    "functions": (None, []),
    "tool_choice": (None, "none"),
    "response_format": (None, {"type": "text"}),
    "modalities": (None, ["text"]),
    "audio": (None,),
    "prediction": (None,),
    "reasoning_effort": (None,),
}
COMMON_FIELDS = {
    "model",
    "max_tokens",
    "temperature",
    "top_p",
    "n",
    "stop",
    "seed",
    "stream",
    "stream_options",
    NUM_DRAFT_TOKENS,
    DRAFT_LEN_POLICY,
    "user",  # the baseline ignores it
}


class OpenAIError(TrtSpecError):
    """One request's error, as OpenAI reports it."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: Optional[str] = None,
        code: Optional[str] = None,
    ):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


@dataclass(frozen=True)
class FrontendSettings:
    """What the frontend needs from the repository it fronts."""

    triton_url: str  # host:port of Triton's gRPC endpoint
    tokenizer_dir: str
    max_seq_len: int
    max_draft_len: int
    add_special_tokens: bool = ADD_SPECIAL_TOKENS
    models: tuple[str, ...] = TEXT_MODELS
    max_input_len: Optional[int] = None  # prompt limit in tokens (None: max_seq_len)
    runtime: str = ENGINE_RUNTIME
    speculative_config: bool = True  # llmapi: the model speculates
    decoupled: bool = True  # llmapi: the model streams
    phase_models: tuple[str, ...] = ()  # llmapi: models not loaded while it serves

    @property
    def prompt_limit(self) -> int:
        return self.max_input_len or self.max_seq_len

    @property
    def llmapi(self) -> bool:
        return self.runtime == LLMAPI_RUNTIME

    @staticmethod
    def from_repository(served, triton_url: str) -> "FrontendSettings":
        """served: a launch.ServedRepository; without a record the runtime is guessed from its files."""
        from ...in_triton.serving import repo_path
        from ...records.bls_parameters import BlsParameters, ParameterError
        from ...repository.writer import RepositoryError, parse_config

        repo = served.path
        path = repo / SPECULATIVE / "config.pbtxt"
        unrecorded_llmapi = not path.is_file() and (repo / lc.MODEL_NAME / "1" / lc.YAML_FILE).is_file()
        llmapi = unrecorded_llmapi if served.runtime is None else served.llmapi
        if llmapi:
            return FrontendSettings.from_llmapi_repository(repo, triton_url)
        if not path.is_file():
            raise RepositoryError(
                f"{repo}: neither {SPECULATIVE}/config.pbtxt nor {lc.MODEL_NAME}/1/{lc.YAML_FILE}: the OpenAI "
                "frontend serves a repository `trt-spec repo` writes (runtime engine: ensemble and the "
                "speculative BLS; runtime llmapi: the LLM-API model); write one with `trt-spec repo`"
            )
        try:
            p = BlsParameters.from_parameters({k: v.string_value for k, v in parse_config(path).parameters.items()})
        except ParameterError as e:
            raise RepositoryError(f"{path}: {e}") from None
        return FrontendSettings(
            triton_url,
            repo_path(str(path.parent), p.tokenizer_dir),
            p.max_seq_len,
            p.max_draft_len,
            p.add_special_tokens,
            max_input_len=p.max_input_len,
        )

    @staticmethod
    def from_llmapi_repository(repo: Path, triton_url: str) -> "FrontendSettings":
        """From the loaded model's model.yaml. The prompt limit assumes no chunked prefill; prompts are counted with
        special tokens (upstream-facts: llmapi-add-special-tokens, llmapi-mtp-max-draft-len)."""
        import yaml

        from ...in_triton.serving import repo_path
        from ...repository.writer import RepositoryError

        path = repo / lc.MODEL_NAME / "1" / lc.YAML_FILE
        try:
            y = yaml.safe_load(path.read_text())
            model = repo_path(str(path.parent.parent), str(y["model"]))
            max_seq_len, max_num_tokens = int(y["max_seq_len"]), int(y["max_num_tokens"])
            spec = y.get("speculative_config")
            k = int((spec or {}).get("max_draft_len", (spec or {}).get(lc.NUM_NEXTN, 0)))
            decoupled = bool((y.get(lc.TRITON_KEY) or {}).get("decoupled", False))
        except (OSError, yaml.YAMLError, KeyError, TypeError, ValueError, AttributeError) as e:
            raise RepositoryError(
                f"{path}: not a model.yaml the OpenAI frontend can read ({type(e).__name__}: {e}); rewrite the "
                "repository with `trt-spec repo`"
            ) from None
        if not Path(model).is_dir():
            raise RepositoryError(
                f"{path}: model {model} is not a directory on this machine: the OpenAI frontend reads the target's "
                "tokenizer there, as the model does; serve the repository where its checkpoint is"
            )
        return FrontendSettings(
            triton_url,
            model,
            max_seq_len,
            k,
            True,
            models=(lc.MODEL_NAME,),
            max_input_len=bc.max_input_len(max_seq_len, max_num_tokens),
            runtime=LLMAPI_RUNTIME,
            speculative_config=spec is not None,
            decoupled=decoupled,
            phase_models=(lc.BASELINE_MODEL,) if (repo / lc.BASELINE_MODEL).is_dir() else (),
        )


@dataclass
class GenRequest:
    """One validated OpenAI request, as the text models take it."""

    model: str
    chat: bool
    text: str  # chat: rendered with the tokenizer's chat template
    prompt_tokens: int
    max_tokens: int
    stream: bool = False
    include_usage: bool = False
    temperature: Optional[float] = 1.0  # None: greedy
    top_p: Optional[float] = None
    seed: Optional[int] = None
    stop: list[str] = field(default_factory=list)
    num_draft_tokens: Optional[int] = None
    draft_len_policy: Optional[str] = None
    tenant: Optional[str] = None  # OpenAI's user, sent to the speculative model only


def _number(body: dict, name: str, kind, lo=None, hi=None, lo_open: bool = False):
    v = body.get(name)
    if v is None:
        return None
    if (
        isinstance(v, bool)
        or not isinstance(v, (int, float))
        or (isinstance(v, float) and not math.isfinite(v))  # Python's JSON reads NaN and Infinity
        or (kind is int and not float(v).is_integer())
    ):
        raise OpenAIError(400, f"'{name}' must be {'an integer' if kind is int else 'a number'}, got {v!r}", param=name)
    v = kind(v)
    if (lo is not None and (v <= lo if lo_open else v < lo)) or (hi is not None and v > hi):
        rng = f"{'(' if lo_open else '['}{lo if lo is not None else '-inf'}, {hi if hi is not None else 'inf'}]"
        raise OpenAIError(400, f"'{name}' must be in {rng}, got {v}", param=name)
    return v


def model_not_found(model: str, s: FrontendSettings) -> Optional[OpenAIError]:
    """The runtime llmapi 404 for an unknown or phase-only model; None for the engine runtime."""
    if not s.llmapi:
        return None
    served = ", ".join(s.models)
    if model in s.phase_models:
        return OpenAIError(
            404,
            f"The model `{model}` is not served: it is this runtime llmapi deployment's baseline, loaded only "
            f"for the baseline phase of `trt-spec check` / `bench`, in place of {served}; this server has {served}",
            param="model",
            code="model_not_found",
        )
    return OpenAIError(
        404,
        f"The model `{model}` does not exist; this server has {served} (TensorRT-LLM's LLM-API model)",
        param="model",
        code="model_not_found",
    )


def _check_fields(body: Any, s: FrontendSettings, chat: bool) -> str:
    """The body's model (one this server has), every field known and served, and n = 1."""
    if not isinstance(body, dict):
        raise OpenAIError(400, "the request body must be a JSON object")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise OpenAIError(400, "'model' is required: one of " + ", ".join(s.models), param="model")
    if model not in s.models:
        raise model_not_found(model, s) or OpenAIError(
            404,
            f"The model `{model}` does not exist; this server has {', '.join(s.models)} "
            f"({BASELINE}: the baseline, {SPECULATIVE}: speculative decoding)",
            param="model",
            code="model_not_found",
        )
    allowed = (
        COMMON_FIELDS
        | IGNORED_FIELDS
        | set(UNSUPPORTED)
        | ({"messages", "max_completion_tokens"} if chat else {"prompt"})
    )
    unknown = sorted(set(body) - allowed)
    if unknown:
        raise OpenAIError(400, f"unrecognized request argument: {unknown[0]!r}", param=unknown[0])
    for name, defaults in UNSUPPORTED.items():
        v = body.get(name)
        # size first: a huge logit_bias is refused without comparing its entries
        if name in body and ((isinstance(v, (dict, list)) and len(v) > 1) or not _is_default(v, defaults)):
            raise OpenAIError(400, f"'{name}' is not supported by this deployment; omit it", param=name)
    _metadata(body.get("metadata"))
    choices = _number(body, "n", int)
    if choices not in (None, 1):
        raise OpenAIError(400, f"'n' must be 1 (one choice per request), got {choices}", param="n")
    return model


def _is_default(v: Any, defaults: tuple) -> bool:
    """`v` is one of `defaults`, a boolean only as a boolean (0 == False in Python)."""
    return any(v == d and isinstance(v, bool) == isinstance(d, bool) for d in defaults)


def _metadata(meta: Any) -> None:
    if meta is None:
        return
    if not isinstance(meta, dict) or len(meta) > METADATA_MAX_KEYS:
        raise OpenAIError(
            400, f"'metadata' must be an object of at most {METADATA_MAX_KEYS} keys; send fewer", param="metadata"
        )
    for k, v in meta.items():
        if len(k) > METADATA_KEY_CHARS or not isinstance(v, str) or len(v) > METADATA_VALUE_CHARS:
            raise OpenAIError(
                400,
                f"'metadata' keys must be at most {METADATA_KEY_CHARS} characters and its values strings of at most "
                f"{METADATA_VALUE_CHARS}; shorten {k[:METADATA_KEY_CHARS]!r}",
                param="metadata",
            )


def _text_content(content: Any, i: int) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts: text only
        if len(content) > OPENAI_MAX_CONTENT_PARTS:
            raise OpenAIError(
                400,
                f"messages[{i}].content has {len(content)} parts; this server takes at most "
                f"{OPENAI_MAX_CONTENT_PARTS} per message; join them",
                param="messages",
            )
        parts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise OpenAIError(400, f"messages[{i}].content: only text parts are served", param="messages")
            parts.append(part["text"])
        return "".join(parts)
    raise OpenAIError(400, f"messages[{i}].content must be a string or a list of text parts", param="messages")


def _chat_text(body: dict, tokenizer, s: FrontendSettings, byte_limit: int) -> str:
    """The messages rendered with the tokenizer's chat template, bounded first (rendering costs like tokenizing)."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise OpenAIError(400, "'messages' must be a non-empty list of {role, content}", param="messages")
    if len(messages) > OPENAI_MAX_MESSAGES:
        raise OpenAIError(
            400,
            f"'messages' has {len(messages)} messages; this server takes at most {OPENAI_MAX_MESSAGES}; send fewer",
            param="messages",
        )
    conv, size = [], 0
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ("system", "developer", "user", "assistant"):
            raise OpenAIError(400, f"messages[{i}] needs a role of system, user or assistant", param="messages")
        role = "system" if m["role"] == "developer" else m["role"]
        conv.append({"role": role, "content": _text_content(m.get("content"), i)})
        size += len(conv[-1]["content"].encode("utf-8"))
        if size > byte_limit:
            raise OpenAIError(
                400,
                f"the messages' text is over {size} bytes: more than any prompt of at most {s.prompt_limit} tokens "
                f"can be ({byte_limit} bytes); shorten it",
                param="messages",
            )
    if not getattr(tokenizer, "chat_template", None):
        raise OpenAIError(400, "the model's tokenizer has no chat template; use /v1/completions")
    return tokenizer.apply_chat_template(conv, tokenize=False, add_generation_prompt=True)


def _prompt_text(body: dict, tokenizer, s: FrontendSettings, chat: bool, byte_limit: int) -> str:
    if chat:
        text = _chat_text(body, tokenizer, s, byte_limit)
    else:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        if not isinstance(prompt, str):
            raise OpenAIError(400, "'prompt' must be a string (one prompt per request)", param="prompt")
        text = prompt
    if not text:
        raise OpenAIError(400, "the prompt is empty; send a non-empty prompt", param="messages" if chat else "prompt")
    return text


def _prompt_tokens(text: str, tokenizer, s: FrontendSettings, chat: bool, byte_limit: int) -> tuple[int, int]:
    """(prompt tokens, tokens the engine can still generate after it)."""
    size = len(text.encode("utf-8"))
    if size > byte_limit:  # before tokenizing, which is slow on huge text
        raise OpenAIError(
            400,
            f"the prompt is {size} bytes: more than any text of at most {s.prompt_limit} tokens "
            f"can be ({byte_limit} bytes); shorten it",
            param="messages" if chat else "prompt",
        )
    prompt_tokens = len(tokenizer.encode(text, add_special_tokens=s.add_special_tokens))
    room = s.max_seq_len - prompt_tokens - s.max_draft_len  # bc.OUTPUT_LEN_CLAMPED
    if room < 1:
        raise OpenAIError(
            400,
            f"the prompt is {prompt_tokens} tokens; this deployment takes at most "
            f"{s.max_seq_len - s.max_draft_len - 1}; shorten it",
            param="prompt",
        )
    return prompt_tokens, room


def _asked_tokens(body: dict, s: FrontendSettings, chat: bool) -> Optional[int]:
    """max_completion_tokens (chat) or max_tokens, refused before tokenizing when no prompt leaves room for it."""
    most = s.max_seq_len - s.max_draft_len - 1  # the room a one-token prompt leaves
    for name in ("max_completion_tokens", "max_tokens") if chat else ("max_tokens",):
        limit = _number(body, name, int, 1)
        if limit is not None and limit > most:
            raise OpenAIError(
                400,
                f"'{name}' {limit} exceeds this deployment's context ({s.max_seq_len} tokens, less max_draft_len "
                f"{s.max_draft_len} and the prompt's tokens); ask for at most {most} less the prompt's tokens",
                param=name,
            )
        if limit is not None:
            return limit
    return None


def _max_tokens(limit: Optional[int], s: FrontendSettings, chat: bool, prompt_tokens: int, room: int) -> int:
    if limit is None:
        limit = room if chat else 16  # OpenAI: completions default to 16 tokens, chat to what the context leaves
    if limit > room:
        raise OpenAIError(
            400,
            f"max_tokens {limit} + the prompt's {prompt_tokens} tokens exceed this deployment's "
            f"context ({s.max_seq_len}, less max_draft_len {s.max_draft_len}); ask for at most "
            f"{room}",
            param="max_tokens",
        )
    return limit


def _stop(body: dict, s: FrontendSettings, byte_limit: int) -> list[str]:
    stop = body.get("stop")
    stop = [stop] if isinstance(stop, str) else stop
    if stop is not None and (
        not isinstance(stop, list) or not all(isinstance(x, str) and x for x in stop) or len(stop) > MAX_STOP_SEQUENCES
    ):
        raise OpenAIError(
            400, f"'stop' must be a string or a list of up to {MAX_STOP_SEQUENCES} non-empty strings", param="stop"
        )
    if stop and sum(len(x.encode("utf-8")) for x in stop) > byte_limit:
        raise OpenAIError(
            400,
            f"'stop' is longer than any text of at most {s.prompt_limit} tokens can be "
            f"({byte_limit} bytes); shorten it",
            param="stop",
        )
    return list(stop or [])


def _stream(body: dict) -> tuple[bool, bool]:
    """(stream, include_usage)."""
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise OpenAIError(400, "'stream' must be true or false", param="stream")
    options = body.get("stream_options")
    if options is not None and (not stream or not isinstance(options, dict)):
        raise OpenAIError(400, "'stream_options' is only allowed with stream: true", param="stream_options")
    include_usage = (options or {}).get("include_usage", False)
    if not isinstance(include_usage, bool):
        raise OpenAIError(400, "'stream_options.include_usage' must be true or false", param="stream_options")
    return stream, include_usage


def _speculation(body: dict, s: FrontendSettings, model: str) -> tuple[Optional[int], Optional[str]]:
    """(num_draft_tokens, draft_len_policy), None where the request leaves them."""
    if s.llmapi:  # the LLM-API model has no such inputs
        for name in (NUM_DRAFT_TOKENS, DRAFT_LEN_POLICY):
            if body.get(name) is not None:
                raise OpenAIError(
                    400,
                    f"'{name}' is not taken by {model}: TensorRT-LLM's LLM-API model speculates as its model.yaml's "
                    f"speculative_config says (runtime: llmapi), with no per-request setting; omit it",
                    param=name,
                )
        return None, None
    k = _number(body, NUM_DRAFT_TOKENS, int, 0, s.max_draft_len)
    policy = body.get(DRAFT_LEN_POLICY)
    if (k is not None or policy is not None) and model != SPECULATIVE:
        name = NUM_DRAFT_TOKENS if k is not None else DRAFT_LEN_POLICY
        raise OpenAIError(400, f"'{name}' applies to the speculative model {SPECULATIVE}, not {model}", param=name)
    if policy is not None and policy not in POLICIES:
        raise OpenAIError(400, f"'{DRAFT_LEN_POLICY}' must be one of {', '.join(POLICIES)}", param=DRAFT_LEN_POLICY)
    return k, policy


def _tenant(body: dict, model: str) -> Optional[str]:
    """OpenAI's `user` as the speculative model's tenant."""
    user = body.get("user")
    if user is None:
        return None
    if not isinstance(user, str):
        raise OpenAIError(400, "'user' must be a string", param="user")
    if len(user.encode("utf-8")) > TENANT_MAX_BYTES:
        raise OpenAIError(
            400,
            f"'user' is longer than {TENANT_MAX_BYTES} bytes; send a shorter id (a hash of it will do)",
            param="user",
        )
    return user if user and model == SPECULATIVE else None


def parse_request(body: Any, tokenizer, s: FrontendSettings, *, chat: bool) -> GenRequest:
    """A request body -> GenRequest, or OpenAIError; cheap checks first, before anything is tokenized."""
    model = _check_fields(body, s, chat)
    asked = _asked_tokens(body, s, chat)
    temperature = _number(body, "temperature", float, 0, 2)
    top_p = _number(body, "top_p", float, 0, 1, lo_open=True)
    seed = _number(body, "seed", int, 0, 2**64 - 1)
    byte_limit = input_byte_limit(tokenizer, s.prompt_limit)  # cached per tokenizer
    stop = _stop(body, s, byte_limit)
    stream, include_usage = _stream(body)
    k, policy = _speculation(body, s, model)
    tenant = _tenant(body, model)
    text = _prompt_text(body, tokenizer, s, chat, byte_limit)
    prompt_tokens, room = _prompt_tokens(text, tokenizer, s, chat, byte_limit)
    limit = _max_tokens(asked, s, chat, prompt_tokens, room)
    greedy = temperature == 0.0
    return GenRequest(
        model,
        chat,
        text,
        prompt_tokens,
        limit,
        stream,
        include_usage,
        None if greedy else (1.0 if temperature is None else temperature),
        None if greedy else (1.0 if top_p is None else top_p),
        seed,
        stop,
        k,
        policy,
        tenant,
    )


def request_tensors(r: GenRequest) -> dict[str, np.ndarray]:
    """The text model's inputs for one request, each [1, …]."""
    t: dict[str, np.ndarray] = {
        TEXT_INPUT: np.array([[r.text.encode("utf-8")]], dtype=object),
        MAX_TOKENS: np.array([[r.max_tokens]], dtype=np.int32),
        STREAM: np.array([[r.stream]], dtype=bool),
        bc.EXCLUDE_INPUT_IN_OUTPUT: np.array([[True]], dtype=bool),
    }
    if r.temperature is not None:  # upstream-facts: trtllm-absent-sampling-greedy
        t[bc.TEMPERATURE] = np.array([[r.temperature]], dtype=np.float32)
        t[TOP_P] = np.array([[r.top_p if r.top_p is not None else 1.0]], dtype=np.float32)
    if r.seed is not None:
        t[bc.SEED] = np.array([[r.seed]], dtype=np.uint64)
    if r.stop:
        t[STOP_WORDS] = np.array([[w.encode("utf-8") for w in r.stop]], dtype=object)
    if r.num_draft_tokens is not None:
        t[NUM_DRAFT_TOKENS] = np.array([[r.num_draft_tokens]], dtype=np.int32)
    if r.draft_len_policy is not None:
        t[DRAFT_LEN_POLICY] = np.array([[r.draft_len_policy.encode("utf-8")]], dtype=object)
    if r.tenant is not None:
        t[TENANT] = np.array([[r.tenant.encode("utf-8")]], dtype=object)
    return t
