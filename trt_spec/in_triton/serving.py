"""Helpers shared by model_repo/'s python-backend models (tokenization, word lists, request parsing, draining).

Preprocessing and the BLS must tokenize exactly alike, or the identity check compares different prompts.
Only numpy at module level (the python-backend environment).
"""

from __future__ import annotations

import faulthandler
import gc
import os
import sys
import traceback
from typing import Callable, Iterable, Mapping, Sequence

import numpy as np

from ..errors import TrtSpecError

# -- Draining: `trt-spec serve` writes one word into the file this names. Triton's own SIGTERM cannot drain: requests
# in flight need new internal ones, which a stopping server refuses (upstream-facts: triton-stopping-refuses-requests).
DRAIN_FILE_ENV = "TRT_SPEC_DRAIN_FILE"
DRAINING, CANCELLING = "drain", "cancel"
# A gRPC stream's error carries only text, so the OpenAI frontend maps this prefix to a 503, as Triton's HTTP
# endpoint reports UNAVAILABLE (upstream-facts: triton-http-unavailable-503).
SHUTTING_DOWN = "server shutting down"
REFUSED_WHILE_DRAINING = f"{SHUTTING_DOWN}: it accepts no new requests; send this request to another replica"
CUT_AT_DRAIN_TIMEOUT = f"{SHUTTING_DOWN}: the request was still running when the drain timeout ended it"


class ShuttingDown(TrtSpecError, RuntimeError):
    """A request refused or ended because the server is draining (UNAVAILABLE)."""


def shutdown_state() -> str:
    """ "" while serving, else DRAINING or CANCELLING."""
    path = os.environ.get(DRAIN_FILE_ENV)
    if not path:
        return ""
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return ""


def refuse_if_draining() -> None:
    """Refuse a new request once the server drains."""
    if shutdown_state():
        raise ShuttingDown(REFUSED_WHILE_DRAINING)


def end_if_cut() -> None:
    """End a request in flight once the drain timeout has passed."""
    if shutdown_state() == CANCELLING:
        raise ShuttingDown(CUT_AT_DRAIN_TIMEOUT)


def triton_error(pb_utils, message: str, exc: BaseException = None):
    """pb_utils.TritonError for a client: UNAVAILABLE (HTTP 503) when shutting down."""
    if isinstance(exc, ShuttingDown):
        return pb_utils.TritonError(message, pb_utils.TritonError.UNAVAILABLE)
    return pb_utils.TritonError(message)


# Errors whose line the client gets; anything else is a fault of ours.
CLIENT_ERRORS = (ValueError, TypeError, ShuttingDown)


def error_line(model: str, exc: BaseException, log: Callable[[str], None]) -> str:
    """The one line a client gets for `exc`; an internal fault is logged in full and shows the client no trace."""
    if isinstance(exc, CLIENT_ERRORS):
        return str(exc)
    log(f"{model}: " + "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)))
    return f"{model}: internal error ({type(exc).__name__}); the server log has the details"


def collect_at_finalize() -> None:
    """Free the model's cyclic garbage while the stub still runs: left to the interpreter's last collection, a
    finished request's response sender is destroyed after the stub has torn down its IPC, and the stub segfaults."""
    gc.collect()


def enable_crash_traces(model: str) -> None:
    """On a fatal signal, print every thread's Python stack to the tritonserver log, naming the crashed model."""
    print(f"trt-spec: {model} stub pid {os.getpid()} (crash traces on)", file=sys.stderr, flush=True)
    faulthandler.enable(file=sys.stderr, all_threads=True)


def respond_each(requests, one: Callable, model: str, pb_utils) -> list:
    """A non-decoupled model's execute(): `one(request)` per request, or its error line if it raised."""
    responses = []
    for request in requests:
        try:
            responses.append(one(request))
        except Exception as e:  # noqa: BLE001 - every request gets an answer
            responses.append(
                pb_utils.InferenceResponse(
                    error=triton_error(pb_utils, error_line(model, e, pb_utils.Logger.log_error), e)
                )
            )
    return responses


def repo_path(model_repository: str, value: str) -> str:
    """A config path parameter made absolute (older repositories wrote them relative to the repository)."""
    if not value or os.path.isabs(value):
        return value
    return os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(model_repository)), value))


def resolve_path_parameters(model_config: dict, model_repository: str) -> dict:
    """model_config with its path parameters made absolute, in place."""
    from ..records.names import PATH_PARAMETERS

    for key in PATH_PARAMETERS:
        p = model_config.get("parameters", {}).get(key)
        if p is not None and p.get("string_value"):
            p["string_value"] = repo_path(model_repository, p["string_value"])
    return model_config


def request_inputs(pb_utils, request, names: Iterable[str]) -> dict:
    """name -> numpy array for each of `names` the request carries."""
    out = {}
    for name in names:
        t = pb_utils.get_input_tensor_by_name(request, name)
        if t is not None:
            out[name] = t.as_numpy()
    return out


def load_tokenizer(tokenizer_dir: str):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokenizer_dir, local_files_only=True)
    return tok


# -- Input size before tokenizing: refuse a prompt that cannot fit max_input_len tokens without tokenizing it.
NORMALIZATION_SLACK = 4  # normalizers may shorten text before splitting (NFKC: "ﬁ" -> "fi")
_TOKEN_BYTES: dict = {}


def max_token_bytes(tokenizer) -> int:
    """The most UTF-8 bytes one token of `tokenizer` decodes to (cached per tokenizer)."""
    key = id(tokenizer)
    if key not in _TOKEN_BYTES:
        longest = 1
        for i in range(len(tokenizer)):
            try:
                longest = max(longest, len(tokenizer.decode([i]).encode("utf-8")))
            except Exception:  # noqa: BLE001 - an id the tokenizer cannot decode covers no text
                pass
        _TOKEN_BYTES[key] = longest
    return _TOKEN_BYTES[key]


def input_byte_limit(tokenizer, max_input_len: int) -> int:
    """Bytes of text beyond which a prompt is certainly over max_input_len tokens."""
    return max_input_len * max_token_bytes(tokenizer) * NORMALIZATION_SLACK


def check_input_bytes(arr, limit: int, name: str, max_input_len: int) -> None:
    """Raise RequestError if the strings of `arr` together exceed `limit` bytes."""
    if arr is None:
        return
    items = arr.reshape(-1) if isinstance(arr, np.ndarray) else arr
    size = sum(len(x) if isinstance(x, (bytes, bytearray)) else len(str(x).encode("utf-8")) for x in items)
    if size > limit:
        from .speculative_loop import RequestError

        raise RequestError(
            f"{name} is {size} bytes: more than any text of at most {max_input_len} tokens "
            f"(max_input_len) can be ({limit} bytes); shorten it"
        )


def encode(tokenizer, text: str, add_special_tokens: bool = True) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=add_special_tokens))


def default_end_id(tokenizer) -> int:
    return int(tokenizer.eos_token_id)


def default_pad_id(tokenizer) -> int:
    pad = tokenizer.pad_token_id
    return int(pad if pad is not None else tokenizer.eos_token_id)


def to_word_list(tokenizer, words: Sequence[str]) -> np.ndarray:
    """TensorRT-LLM's [2, L] word list (ids, end offsets); no words: [2, 0]
    (upstream-facts: trtllm-empty-word-list-shape)."""
    from ..records.backend_contract import word_list_array

    ids = [encode(tokenizer, w, add_special_tokens=False) for w in words if w]
    return word_list_array(ids) if any(ids) else np.zeros((2, 0), dtype=np.int32)


def requested_only(tensors: Mapping[str, np.ndarray], requested: Iterable[str]) -> dict[str, np.ndarray]:
    """The tensors the request asked for, and no others: an unrequested output corrupts the stub's heap
    (upstream-facts: python-backend-unrequested-output-gil)."""
    wanted = set(requested)
    return {name: value for name, value in tensors.items() if name in wanted}


def check_no_embedding_bias(words, weights) -> None:
    """Raise ValueError for a non-empty embedding bias; empty ones are accepted
    (upstream-facts: trtllm-clients-empty-embedding-bias)."""
    from ..records.names import EMBEDDING_BIAS

    for name, arr in zip(EMBEDDING_BIAS, (words, weights)):
        if arr is not None and np.asarray(arr).size:
            raise ValueError(
                f"{name} is not supported by this deployment (no embedding bias); send it empty or omit it"
            )


def decode_strings(arr) -> list[str]:
    """A Triton BYTES tensor (any shape) -> flat list of str."""
    if arr is None:
        return []
    return [
        x.decode("utf-8", errors="replace") if isinstance(x, (bytes, bytearray)) else str(x)
        for x in np.asarray(arr, dtype=object).reshape(-1)
    ]


def scalar(arr, default, kind=None):
    """First element of an optional tensor, or the default."""
    if arr is None:
        return default
    flat = np.asarray(arr).reshape(-1)
    if flat.size == 0:
        return default
    v = flat[0]
    return kind(v) if kind else v.item() if hasattr(v, "item") else v


class IncrementalDetokenizer:
    """Streams text for a growing token list without splitting multi-byte characters."""

    def __init__(self, tokenizer, skip_special_tokens: bool = True):
        self.tok = tokenizer
        self.skip = skip_special_tokens
        self.tokens: list[int] = []
        self.emitted = ""

    def add(self, new_tokens: Sequence[int]) -> str:
        self.tokens.extend(int(t) for t in new_tokens)
        text = self.tok.decode(self.tokens, skip_special_tokens=self.skip)
        if text.endswith("\ufffd"):  # an incomplete UTF-8 sequence: wait for the next tokens
            return ""
        delta = text[len(self.emitted) :] if text.startswith(self.emitted) else text
        self.emitted = text
        return delta

    def flush(self) -> str:
        text = self.tok.decode(self.tokens, skip_special_tokens=self.skip)
        delta = text[len(self.emitted) :] if text.startswith(self.emitted) else ""
        self.emitted = text
        return delta


class StopCutter:
    """Text deltas up to the first stop string, holding back what could still become one."""

    def __init__(self, stops: list[str]):
        self.stops = stops
        self.hold = max((len(x) for x in stops), default=1) - 1
        self.text = ""  # everything received
        self.sent = 0  # characters of it handed out
        self.stopped = False

    def add(self, delta: str) -> str:
        if self.stopped:
            return ""
        self.text += delta
        hits = [i for i in (self.text.find(x) for x in self.stops) if i >= 0]
        if hits:
            self.stopped = True
            out, self.sent = self.text[self.sent : min(hits)], min(hits)
            return out
        upto = max(self.sent, len(self.text) - self.hold)
        out, self.sent = self.text[self.sent : upto], upto
        return out

    def flush(self) -> str:
        if self.stopped:
            return ""
        out, self.sent = self.text[self.sent :], len(self.text)
        return out
