"""The plain functions behind `trt-spec check`, `trt-spec bench served|openai|in-process` (and `tune`'s client): reach
the deployment, put the prompts in the form it is measured with, gather every measurement of a run in one list for
phases.measure (one baseline switch for all of them), and return the report. The CLI parses options, calls one of
these and prints; a user's mistake here is a ClientError (or ValueError) line."""

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
    """A client for the baseline and speculative models at url; one clear ClientError if either is not ready (what is
    there instead, and the fix) after waiting up to `wait` seconds."""
    from ..records.names import TEXT_MODELS
    from .client import read_key_file

    c = LLMClient(url, protocol, admin_key=read_key_file(admin_key_file) if admin_key_file else None)
    c.check_ready(list(TEXT_MODELS), wait)
    line = c.check_baseline()
    if line:
        note(line)
    return c


def chat_prompts(prompts: list[Prompt], tokenizer: Optional[str], note: Note) -> list[Prompt]:
    """The prompts wrapped in TOKENIZER's chat template (as an instruct model is served); unchanged without one, and
    then a plain note: the served repository's tokenizer lives on the server, so the client cannot apply its template
    by itself, and the template changes what is measured."""
    if not tokenizer:
        note(RAW_PROMPTS)
        return prompts
    from ..in_triton.serving import load_tokenizer
    from .prompts import with_chat_template

    return with_chat_template(prompts, load_tokenizer(tokenizer))


def template_chat(tok, where: str):
    """--turns all where the client applies the chat template: a bench.Chat that renders each conversation in tok's
    template and feeds back the answer's tokens decoded (the text where the server returns none); one ClientError line
    when tok has no template (where: whose tokenizer)."""
    from .bench import Chat
    from .prompts import NEEDS_TEMPLATE, render_conversation

    if not getattr(tok, "chat_template", None):
        raise ClientError(NEEDS_TEMPLATE.format(why=f"{where} has no chat template: pass a tokenizer that has one"))

    def answer(g) -> str:
        return tok.decode(g.output_ids, skip_special_tokens=True) if g.output_ids else g.text

    return Chat(lambda messages: render_conversation(tok, messages), answer)


# --- check ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CheckOptions:
    num_draft_tokens: Optional[int] = None  # None: the deployment's
    tokenizer: Optional[str] = None  # divergence context, the near-tie check, the chat template
    near_tie_margin: Optional[float] = None
    raw: bool = False  # no chat template even with a tokenizer
    temperature: float = 0.0  # > 0: also the distribution check
    samples: int = defaults.SAMPLING_SAMPLES


def run_check(client: LLMClient, prompts: list[Prompt], o: CheckOptions, *, stage: Stage, note: Note):
    """Token-for-token identity (and, at a temperature, the distribution check) of the speculative model against the
    baseline: an identity.CheckReport."""
    from .identity import greedy_measurement, sampling_measurement

    tok = None
    if o.tokenizer:
        from ..in_triton.serving import load_tokenizer
        from .prompts import with_chat_template

        tok = load_tokenizer(o.tokenizer)
        client.use_tokenizer(tok)  # an LLM-API model returns text only: its tokens are this tokenizer's
        if not o.raw:
            prompts = with_chat_template(prompts, tok)
    ms = [
        greedy_measurement(
            client, prompts, num_draft_tokens=o.num_draft_tokens, tokenizer=tok, near_tie_margin=o.near_tie_margin
        )
    ]
    if o.temperature > 0:
        ms.append(
            sampling_measurement(
                client, prompts, temperature=o.temperature, samples=o.samples, num_draft_tokens=o.num_draft_tokens
            )
        )
    rep, *dist = measure(client, ms, stage=stage, note=note)  # a baseline loaded for its phase: one switch for both
    for rows in dist:
        rep.distribution.extend(rows)
    return rep


# --- bench ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Runs:
    """The paired runs of every bench mode: one per --policy x --k (None: the deployment's), each prompts x repeats."""

    ks: tuple[int, ...] = ()
    repeats: int = 1
    policies: tuple[str, ...] = ()
    turns: str = defaults.TURNS  # all: every turn of a multi-turn question, as a conversation (prompts.TURNS)


@dataclass(frozen=True)
class Load:
    """The load runs of a bench against a server, at the first --k and --policy."""

    levels: tuple[int, ...] = ()  # a concurrency sweep over these numbers of requests in flight
    rate: Optional[float] = None  # an open-loop run at Poisson arrivals of rate/s, with goodput
    num_requests: Optional[int] = None  # of the rate run (None: prompts x repeats)
    slo_ttft_ms: Optional[float] = None
    slo_tpot_ms: Optional[float] = None


@dataclass
class Target:
    """A server the bench reaches: its client, a factory of more (one per concurrent stream), the protocol a report
    names, its title, and the prompts in the form it is sent."""

    client: object
    new_client: Callable[[], object]
    protocol: str
    title: str
    prompts: list[Prompt]
    chat: object = None  # a bench.Chat with --turns all (prompts then raw: each turn rendered as it goes out)


def check_turns(runs: Runs, load: Load) -> None:
    """--turns all runs the paired A/B only: one ClientError line, before any server is reached, with a load run."""
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
    """A Triton deployment at url (`bench served`); --turns all needs --tokenizer with a chat template (refused before
    the server is reached). tenant: sent with every speculative request (the BLS's suffix cache scope)."""
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
    """One or two OpenAI-compatible servers (`bench openai`); with the completions API the chat template is the
    client's to apply (--tokenizer). --turns all: over the chat API each conversation goes out as its messages (the
    server applies its template); over the completions API it needs --tokenizer with a chat template. tenant:
    OpenAI's `user` on the speculative requests."""
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
    """The paired A/B runs, then the concurrency sweep and the request-rate run if asked: the bench report."""
    check_turns(runs, load)
    from .bench import SLO, ab_measurement, rate_measurement, sweep_measurement

    prompts = t.prompts
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
    """The served speculative loop and policy over CONFIG's built reference engines, in this process: the report of
    inprocess.run_inprocess (plus lean_vs_hf with compare_hf). A bad config, build or request is a ValueError
    (ConfigError) or BuildError line."""
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
        )
        if compare_hf:
            rep["lean_vs_hf"] = hf_timing(dep, prompts)
    finally:
        dep.close()
    return rep
