"""`trt-spec serve --openai-port` with a key, over the real tritonserver: the official openai SDK with the key is
answered, a wrong key is openai.AuthenticationError, /health and /metrics stay open for probes and Prometheus, and
the key is on no command line. Without a key and with --host 0.0.0.0 the frontend stays on loopback and says so."""

from __future__ import annotations

import socket
import urllib.error
import urllib.request
from pathlib import Path

import pytest

openai = pytest.importorskip("openai")


from ..farm import OPENAI_KEY as KEY  # noqa: E402
from ..farm import env_without_openai_key, serve_openai, stop_serve  # noqa: E402


def get(url: str, headers: dict | None = None):
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=30) as r:
            return r.status, r.headers, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers, e.read()


@pytest.mark.slow  # a server of its own (~20-50 s): `make slow`, which CI runs
def test_a_key_file_guards_v1_and_leaves_health_and_metrics_open(chat_repo, tmp_path):
    key_file = tmp_path / "openai.key"
    key_file.write_text(KEY + "\n")
    proc, line, ports, _ = serve_openai(
        chat_repo, tmp_path, "--openai-api-key-file", str(key_file), env=env_without_openai_key()
    )
    try:
        base = f"http://127.0.0.1:{ports['openai']}"
        assert f"OpenAI {base}/v1" in line
        good = openai.OpenAI(base_url=base + "/v1", api_key=KEY, max_retries=0, timeout=120)
        models = {m.id for m in good.models.list()}
        assert models
        chat = good.chat.completions.create(
            model=sorted(models)[0], messages=[{"role": "user", "content": "hi"}], max_tokens=4, temperature=0
        )
        assert chat.choices[0].message.content is not None
        bad = openai.OpenAI(base_url=base + "/v1", api_key=KEY + "x", max_retries=0, timeout=30)
        with pytest.raises(openai.AuthenticationError) as e:
            bad.models.list()
        assert e.value.status_code == 401 and e.value.code == "invalid_api_key"
        with pytest.raises(openai.AuthenticationError):
            bad.chat.completions.create(model=sorted(models)[0], messages=[{"role": "user", "content": "hi"}])
        status, headers, body = get(base + "/v1/models")  # no header at all
        assert status == 401 and headers["WWW-Authenticate"] == "Bearer" and KEY not in body.decode()
        for path in ("/health", "/metrics"):  # probes and Prometheus need no key
            assert get(base + path)[0] == 200, path
        assert get(base + "/openapi.json")[0] != 401  # the schema is not behind the key either
        # the key travels by file: no process's command line holds it
        for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
            try:
                assert KEY.encode() not in cmdline.read_bytes()
            except OSError:
                continue
    finally:
        stop_serve(proc)


def _lan_address() -> str | None:
    """An address of this machine other than loopback (none on a host without a network)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("10.255.255.255", 1))  # no packet is sent: this only picks the outgoing interface
            address = s.getsockname()[0]
        except OSError:
            return None
    return None if address.startswith("127.") else address


@pytest.mark.slow  # a server of its own (~20-50 s): `make slow`, which CI runs
def test_no_key_and_host_0000_keeps_the_frontend_on_loopback(chat_repo, tmp_path):
    proc, line, ports, err_path = serve_openai(chat_repo, tmp_path, "--host", "0.0.0.0", env=env_without_openai_key())
    try:
        base = f"http://127.0.0.1:{ports['openai']}"
        assert f"OpenAI {base}/v1" in line  # the address actually bound
        (note,) = [n for n in err_path.read_text().splitlines() if "binds 127.0.0.1" in n]
        assert "--openai-api-key-file FILE" in note and "--openai-allow-unauthenticated" in note
        assert get(base + "/v1/models")[0] == 200  # no key: loopback callers need none
        lan = _lan_address()
        if lan is not None:
            assert get(f"http://{lan}:{ports['http']}/v2/health/ready")[0] == 200  # Triton's ports follow --host
            with pytest.raises(OSError):
                socket.create_connection((lan, ports["openai"]), timeout=5).close()
    finally:
        stop_serve(proc)
