"""The functions behind `trt-spec check` and `trt-spec bench served|openai|in-process`: reach the deployment, shape
the prompts, run every measurement in one phases.measure call, return the report. User mistakes raise ClientError."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional, Sequence

from ..records import defaults
from .client import ClientError, LLMClient
from .phases import Stage, measure
from .prompts import Prompt

Note = Callable[[str], None]

RAW_PROMPTS = (
    "prompts go out raw, without a chat template; an instruct model answers raw text differently from its "
    "users' chat requests, and speculation pays differently on each. Pass --tokenizer DIR (the target's "
    "tokenizer: tokenizer_dir in REPO/preprocessing/config.pbtxt) to send them as chat requests."
)


def served_client(
    url: str, protocol: str, wait: Optional[float] = None, admin_key_file: Optional[str] = None, *, note: Note
) -> LLMClient:
    """A client for both models at url; ClientError if either is not ready within `wait` seconds."""
    from ..records.names import TEXT_MODELS
    from .client import read_key_file

    c = LLMClient(url, protocol, admin_key=read_key_file(admin_key_file) if admin_key_file else None)
    c.check_ready(list(TEXT_MODELS), wait)
    line = c.check_baseline()
    if line:
        note(line)
    return c


def chat_prompts(prompts: list[Prompt], tokenizer: Optional[str], note: Note) -> list[Prompt]:
    """The prompts in the tokenizer's chat template; unchanged (with a note) without a tokenizer."""
    if not tokenizer:
        note(RAW_PROMPTS)
        return prompts
    from ..in_triton.serving import load_tokenizer
    from .prompts import with_chat_template

    return with_chat_template(prompts, load_tokenizer(tokenizer))


def template_chat(tok, where: str):
    """A bench.Chat rendering conversations in tok's chat template; ClientError if tok has none."""
    from .bench import Chat
    from .prompts import NEEDS_TEMPLATE, render_conversation

    if not getattr(tok, "chat_template", None):
        raise ClientError(NEEDS_TEMPLATE.format(why=f"{where} has no chat template: pass a tokenizer that has one"))

    def answer(g) -> str:
        return tok.decode(g.output_ids, skip_special_tokens=True) if g.output_ids else g.text

    return Chat(lambda messages: render_conversation(tok, messages), answer)


@dataclass(frozen=True)
class CheckOptions:
    num_draft_tokens: Optional[int] = None
    tokenizer: Optional[str] = None
    margin: Optional[str] = None  # --margin FILE|VALUE (parse_margin); None: measured, else the fallback
    raw: bool = False  # no chat template
    temperature: float = 0.0  # > 0 adds the distribution check
    samples: int = defaults.SAMPLING_SAMPLES


def parse_margin(text: str) -> tuple[float, str]:
    """--margin VALUE (logits > 0) or FILE (a `check --format json` report's measured_margin): (margin, its source).

    Raises ClientError."""
    import json
    import math

    try:
        value = float(text)
    except ValueError:
        value = None
    if value is not None:
        if not (math.isfinite(value) and value > 0):
            raise ClientError(f"--margin {text}: give a number of logits > 0, or a previous check's JSON report")
        return value, f"--margin {text}"
    try:
        report = json.loads(Path(text).read_text())
    except OSError as e:
        raise ClientError(
            f"--margin {text}: not a number and not a readable file ({e.strerror}); give logits > 0 or the JSON "
            "report of a previous `trt-spec check --format json`"
        ) from None
    except ValueError:
        raise ClientError(f"--margin {text}: not JSON; give the report `trt-spec check --format json` wrote") from None
    measured = report.get("measured_margin") if isinstance(report, dict) else None
    if isinstance(measured, bool) or not isinstance(measured, (int, float)) or not measured > 0:
        raise ClientError(
            f"--margin {text}: the report carries no measured_margin (its check probed no engine logits: runtime "
            "llmapi, or no --tokenizer); give logits > 0, or a report of a check run with --tokenizer on an engine "
            "deployment"
        )
    return float(measured), f"--margin {text}: measured there"


def run_check(client: LLMClient, prompts: list[Prompt], o: CheckOptions, *, stage: Stage, note: Note):
    """Identity (and, at a temperature, distribution) check: an identity.CheckReport."""
    from .identity import greedy_measurement, sampling_measurement

    tok = None
    if o.tokenizer:
        from ..in_triton.serving import load_tokenizer
        from .prompts import with_chat_template

        tok = load_tokenizer(o.tokenizer)
        client.use_tokenizer(tok)
        if not o.raw:
            prompts = with_chat_template(prompts, tok)
    margin, source = parse_margin(o.margin) if o.margin is not None else (None, "")
    ms = [
        greedy_measurement(
            client,
            prompts,
            num_draft_tokens=o.num_draft_tokens,
            tokenizer=tok,
            near_tie_margin=margin,
            margin_source=source,
        )
    ]
    if o.temperature > 0:
        ms.append(
            sampling_measurement(
                client, prompts, temperature=o.temperature, samples=o.samples, num_draft_tokens=o.num_draft_tokens
            )
        )
    rep, *dist = measure(client, ms, stage=stage, note=note)
    for rows in dist:
        rep.distribution.extend(rows)
    return rep


@dataclass(frozen=True)
class Runs:
    """Paired runs: one per --policy x --k, each prompts x repeats."""

    ks: tuple[int, ...] = ()
    repeats: int = 1
    policies: tuple[str, ...] = ()
    turns: str = defaults.TURNS
    profile: bool = False  # bench --profile: where each speculative request's time went (records/profile.py)


@dataclass(frozen=True)
class Load:
    """Load runs at the first --k and --policy."""

    levels: tuple[int, ...] = ()  # concurrency sweep
    rate: Optional[float] = None  # requests/s, open loop
    num_requests: Optional[int] = None  # None: prompts x repeats
    slo_ttft_ms: Optional[float] = None
    slo_tpot_ms: Optional[float] = None


@dataclass
class Target:
    """A server to bench: a client, a client factory, its labels and the prompts as sent."""

    client: object
    new_client: Callable[[], object]
    protocol: str
    title: str
    prompts: list[Prompt]
    chat: object = None  # bench.Chat with --turns all


def check_turns(runs: Runs, load: Load) -> None:
    """Refuse --turns all with a load run, before any server is reached."""
    if runs.turns == "all" and (load.levels or load.rate is not None):
        raise ClientError(
            "--turns all measures the paired A/B only (a conversation's turns go one after another); run "
            "--concurrency / --request-rate with --turns first"
        )


def _needs_tokenizer(turns: str, tokenizer: Optional[str], why: str) -> None:
    from .prompts import NEEDS_TEMPLATE

    if turns == "all" and not tokenizer:
        raise ClientError(NEEDS_TEMPLATE.format(why=why))


def served_target(
    url: str,
    protocol: str,
    wait: Optional[float],
    admin_key_file: Optional[str],
    tokenizer: Optional[str],
    prompts: list[Prompt],
    note: Note,
    turns: str = defaults.TURNS,
    tenant: Optional[str] = None,
) -> Target:
    """A Triton deployment at url (`bench served`); --turns all needs a tokenizer with a chat template."""
    _needs_tokenizer(turns, tokenizer, "prompts without --tokenizer go out raw: pass --tokenizer DIR (the target's)")
    tok = chat = None
    if tokenizer:
        from ..in_triton.serving import load_tokenizer

        tok = load_tokenizer(tokenizer)
        chat = template_chat(tok, f"--tokenizer {tokenizer}") if turns == "all" else None
    client = served_client(url, protocol, wait, admin_key_file, note=note)
    client.tenant = tenant
    if tok is not None:
        client.use_tokenizer(tok)
    title = f"{url} ({protocol})"
    if chat is not None:
        return Target(client, client.clone, protocol, title, prompts, chat)
    return Target(client, client.clone, protocol, title, chat_prompts(prompts, tokenizer, note))


def openai_target(
    urls: Sequence[str],
    models: Sequence[str],
    api: str,
    api_key: str,
    tokenizer: Optional[str],
    prompts: list[Prompt],
    note: Note,
    turns: str = defaults.TURNS,
    tenant: Optional[str] = None,
) -> Target:
    """One or two OpenAI-compatible servers (`bench openai`); the completions API needs the client's template."""
    from .bench import Chat
    from .openai_client import client_factory, endpoints

    try:
        roles = endpoints(tuple(urls), tuple(models))
    except ValueError as e:
        raise ClientError(str(e)) from None
    chat = None
    if turns == "all" and api == "chat":
        chat = Chat(lambda messages: messages)
    elif turns == "all":
        _needs_tokenizer(turns, tokenizer, "--api completions sends raw text: pass --tokenizer DIR, or use --api chat")
        from ..in_triton.serving import load_tokenizer

        chat = template_chat(load_tokenizer(tokenizer), f"--tokenizer {tokenizer}")
    new_client = client_factory(roles, api, api_key, tenant)
    client = new_client()
    client.check_ready(list(roles))
    title = " vs ".join(f"{e.model} at {e.base_url}" for e in roles.values())
    if api == "completions" and chat is None:
        prompts = chat_prompts(prompts, tokenizer, note)
    return Target(client, new_client, f"openai {api}", title, prompts, chat)


def bench_remote(t: Target, runs: Runs, load: Load, *, stage: Stage, note: Note) -> dict:
    """The bench report: paired A/B runs, plus the sweep and request-rate run if asked."""
    check_turns(runs, load)
    from .bench import SLO, ab_measurement, rate_measurement, sweep_measurement

    prompts = t.prompts
    if runs.profile:
        if getattr(t.client, "llmapi", False):
            raise ClientError(
                "--profile reads the profile trt-spec's BLS returns; the LLM-API model (runtime llmapi) has none: "
                "run without --profile"
            )
        t.client.profile = True  # the paired runs' speculative requests ask the BLS for it (bench._request)
    k0, policy0 = (runs.ks[0] if runs.ks else None), (runs.policies[0] if runs.policies else None)
    ms = [
        ab_measurement(t.client, prompts, k=k, repeats=runs.repeats, policy=policy, chat=t.chat)
        for policy in (list(runs.policies) or [None])
        for k in (list(runs.ks) or [None])
    ]
    n_ab = len(ms)
    if load.levels:
        ms.append(
            sweep_measurement(
                t.new_client, prompts, load.levels, k=k0, requests_per_level=len(prompts) * runs.repeats, policy=policy0
            )
        )
    if load.rate is not None:
        slo = SLO(
            load.slo_ttft_ms / 1e3 if load.slo_ttft_ms is not None else None,
            load.slo_tpot_ms / 1e3 if load.slo_tpot_ms is not None else None,
        )
        ms.append(
            rate_measurement(
                t.new_client,
                prompts,
                load.rate,
                load.num_requests or len(prompts) * runs.repeats,
                k=k0,
                policy=policy0,
                slo=slo,
            )
        )
    results = measure(t.client, ms, stage=stage, note=note)
    conc = results[n_ab] if load.levels else []
    rate = results[-1] if load.rate is not None else None
    return {
        "title": f"bench {t.title}",
        "bench": [{"protocol": t.protocol, **res} for res in results[:n_ab]],
        "concurrency": conc,
        **({"rate": rate} if rate else {}),
    }


def bench_in_process(
    config: Path,
    sets: Sequence[str],
    prompts: list[Prompt],
    runs: Runs,
    *,
    ignore_eos: bool = False,
    threads: Optional[int] = None,
    compare_hf: bool = False,
    progress: Optional[Callable[[str], None]] = None,
) -> dict:
    """The speculative loop over CONFIG's built reference engines, in process; raises ConfigError or BuildError."""
    from ..records.config import load_config
    from .inprocess import compare_hf as hf_timing
    from .inprocess import load_deployment, run_inprocess

    cfg = load_config(str(config), tuple(sets))
    if threads:
        import torch

        torch.set_num_threads(threads)
    dep = load_deployment(cfg.resolved_output_dir(Path(config)))
    try:
        rep = run_inprocess(
            dep,
            prompts,
            list(runs.ks) or [dep.default_k],
            repeats=runs.repeats,
            policies=list(runs.policies) or [None],
            ignore_eos=ignore_eos,
            progress=progress,
            turns=runs.turns,
            profile=runs.profile,
        )
        if compare_hf:
            rep["lean_vs_hf"] = hf_timing(dep, prompts)
    finally:
        dep.close()
    return rep
