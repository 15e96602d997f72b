"""`trt-spec serve`'s OpenAI key and limits: the key goes to the frontend by file (or the inherited environment
variable), never on a command line; a key file it cannot use is one line before anything starts; with no key the
frontend stays on loopback unless told otherwise. The frontend's own check of the key: tests/e2e/test_openai_keys.py."""

from __future__ import annotations

import subprocess
import sys

import pytest
from click.testing import CliRunner

from trt_spec.builder.pipeline import manifest_for_config
from trt_spec.cli import main
from trt_spec.records import defaults
from trt_spec.repository.writer import write_repository
from trt_spec.serve.supervisor import ServeOptions, is_loopback, openai_bind_host

from ..conftest import REPO

KEY = "sk-test-0123456789abcdef"


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    out = tmp_path_factory.mktemp("ngram") / "repo"
    write_repository(manifest_for_config(REPO / "build_configs" / "qwen25-coder-32b-ngram-h100.yaml"), out)
    return out


@pytest.mark.parametrize(
    "host, has_key, allow, bound",
    [
        ("0.0.0.0", False, False, "127.0.0.1"),  # open to the network with no key: loopback only
        ("10.1.2.3", False, False, "127.0.0.1"),
        ("serving.example", False, False, "127.0.0.1"),  # a name may resolve to any interface
        ("::", False, False, "127.0.0.1"),
        ("0.0.0.0", True, False, "0.0.0.0"),  # a key: --host as given
        ("0.0.0.0", False, True, "0.0.0.0"),  # told to: --host as given
        ("127.0.0.1", False, False, "127.0.0.1"),
        ("127.0.0.2", False, False, "127.0.0.2"),  # loopback already
        ("localhost", False, False, "localhost"),
        ("::1", False, False, "::1"),
    ],
)
def test_bind_host_rule(host, has_key, allow, bound):
    assert openai_bind_host(host, has_key, allow) == bound
    assert is_loopback(bound) or has_key or allow


def test_has_key_from_the_file_or_the_environment(tmp_path):
    o = ServeOptions(tmp_path, openai_port=9000)
    assert not o.openai_has_key({}) and not o.openai_has_key({defaults.OPENAI_API_KEY_ENV: ""})
    assert o.openai_has_key({defaults.OPENAI_API_KEY_ENV: KEY})
    assert ServeOptions(tmp_path, openai_port=9000, openai_api_key_file=tmp_path / "k").openai_has_key({})


def _dry(repo, *extra, env=None):
    r = CliRunner().invoke(
        main,
        ["serve", str(repo), "--dry-run", "--openai-port", "9123", *extra],
        env={defaults.OPENAI_API_KEY_ENV: None, **(env or {})},
    )
    assert r.exit_code == 0, r.output
    (frontend,) = [line for line in r.output.splitlines() if "trt_spec.serve.openai.frontend" in line]
    return r.output, frontend


def test_dry_run_shows_the_key_file_never_the_key(repo, tmp_path):
    key_file = tmp_path / "openai.key"
    key_file.write_text(KEY + "\n")
    out, frontend = _dry(
        repo,
        "--host",
        "0.0.0.0",
        "--openai-api-key-file",
        str(key_file),
        "--openai-max-concurrent",
        "7",
        "--openai-max-queued",
        "3",
        "--openai-max-body-bytes",
        "65536",
    )
    assert KEY not in out
    assert f"--api-key-file {key_file}" in frontend and "--host 0.0.0.0" in frontend
    assert "--max-concurrent 7" in frontend and "--max-queued 3" in frontend and "--max-body-bytes 65536" in frontend
    # the key in the environment: inherited by the child, never printed; the frontend binds --host
    out, frontend = _dry(repo, "--host", "0.0.0.0", env={defaults.OPENAI_API_KEY_ENV: KEY})
    assert KEY not in out and "--api-key-file" not in frontend and "--host 0.0.0.0" in frontend
    assert f"--max-concurrent {defaults.OPENAI_MAX_CONCURRENT}" in frontend  # the defaults, shown


def test_no_key_and_a_network_host_keeps_the_frontend_on_loopback(repo):
    out, frontend = _dry(repo, "--host", "0.0.0.0")
    assert "--host 127.0.0.1" in frontend
    assert "--http-address=0.0.0.0" in out  # Triton's own ports follow --host
    (note,) = [line for line in out.splitlines() if "binds 127.0.0.1:9123 only" in line]
    assert "--openai-api-key-file FILE" in note and "--openai-allow-unauthenticated" in note
    out, frontend = _dry(repo, "--host", "0.0.0.0", "--openai-allow-unauthenticated")
    assert "--host 0.0.0.0" in frontend and "binds 127.0.0.1" not in out
    out, frontend = _dry(repo)  # loopback already: nothing to say
    assert "--host 127.0.0.1" in frontend and "binds 127.0.0.1" not in out


def test_help_shows_the_limits_and_their_defaults():
    text = " ".join(CliRunner().invoke(main, ["serve", "--help"], terminal_width=200).output.split())
    for flag, default in (
        ("--openai-max-concurrent", defaults.OPENAI_MAX_CONCURRENT),
        ("--openai-max-queued", defaults.OPENAI_MAX_QUEUED),
        ("--openai-max-body-bytes", defaults.OPENAI_MAX_BODY_BYTES),
    ):
        assert flag in text and f"[default: {default};" in text
    assert "--openai-api-key-file" in text and "--openai-allow-unauthenticated" in text
    assert defaults.OPENAI_API_KEY_ENV in text


def test_a_bad_key_file_is_one_line_exit_2_before_anything_starts(repo, tmp_path):
    empty, blank_first = tmp_path / "empty.key", tmp_path / "blank.key"
    empty.write_text("")
    blank_first.write_text("\n" + KEY + "\n")
    cases = [
        (["--openai-port", "9124", "--openai-api-key-file", str(tmp_path / "missing.key")], "cannot be read"),
        (["--openai-port", "9124", "--openai-api-key-file", str(empty)], "first line is empty"),
        (["--openai-port", "9124", "--openai-api-key-file", str(blank_first)], "first line is empty"),
        (["--openai-api-key-file", str(empty)], "needs --openai-port"),
    ]
    for extra, expect in cases:
        log = tmp_path / "triton.log"
        r = subprocess.run(
            [sys.executable, "-m", "trt_spec.cli", "serve", str(repo), "--log", str(log), *extra],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert r.returncode == 2, (extra, r.stderr)
        assert len(r.stderr.strip().splitlines()) == 1 and expect in r.stderr, r.stderr
        assert KEY not in r.stderr + r.stdout
        assert not log.exists() and "plain command" not in r.stderr  # tritonserver was never started
