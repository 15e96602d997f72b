"""The admin key of a served repository: Triton's admin APIs answer only requests carrying it in ADMIN_HEADER.

model-config is restricted too, since configs name this machine's absolute engine and tokenizer paths. A running
server's key is in admin_key_path(PORT) (0600, removed on stop) for the harness on the same host.
"""

from __future__ import annotations

import os
import re
import secrets
import shlex
from pathlib import Path
from typing import Optional

from ..records import defaults
from .errors import ServerError

RESTRICTED_APIS = ("shared-memory", "model-config", "model-repository", "trace", "logging")
ADMIN_HEADER = "triton-admin-key"
GRPC_ADMIN_HEADER = f"triton-grpc-protocol-{ADMIN_HEADER}"  # (upstream-facts: triton-grpc-restricted-header-prefix)
ADMIN_KEY_RE = re.compile(r"[A-Za-z0-9._~+/-]{16,}")


def launch_key(admin_key: Optional[str]) -> str:
    """The given key (checked), else a random one nobody is told."""
    if admin_key is not None and not ADMIN_KEY_RE.fullmatch(admin_key):
        raise ServerError("the admin key must be at least 16 characters from A-Z a-z 0-9 . _ ~ + / -")
    return admin_key or secrets.token_urlsafe(32)


def restricted_arg(key: str) -> str:
    """The value of --http-restricted-api and --grpc-restricted-protocol."""
    return ",".join(RESTRICTED_APIS) + f":{ADMIN_HEADER}={key}"


def shown_key(admin_key_file: Optional[Path]) -> str:
    """What a printed command line shows in place of the key."""
    return (
        f'"$(cat {shlex.quote(str(admin_key_file))})"'
        if admin_key_file
        else "\"$(python3 -c 'import secrets; print(secrets.token_urlsafe(32))')\""
    )


def read_admin_key(path: Path) -> str:
    """The key stored in path; a missing file is created (0600) with a random key."""
    path = Path(path)
    try:
        if not path.exists():
            key = secrets.token_urlsafe(32)
            with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as f:
                f.write(key + "\n")
            return key
        key = path.read_text().strip()
    except OSError as e:
        raise ServerError(f"admin key file {path}: {e.strerror}") from None
    if not ADMIN_KEY_RE.fullmatch(key):
        raise ServerError(
            f"admin key file {path}: the key must be one line of at least 16 characters from "
            f"A-Z a-z 0-9 . _ ~ + / -; make one with: python -c 'import secrets; "
            f"print(secrets.token_urlsafe(32))' > {shlex.quote(str(path))}"
        )
    return key


def admin_key_path(port: int) -> Path:
    """Where `trt-spec serve` leaves the key of its server on `port` (HTTP or gRPC) while it runs."""
    return defaults.cache_dir() / defaults.ADMIN_KEYS_SUBDIR / f"{int(port)}.key"


def write_admin_key_files(key: str, ports: list[int]) -> list[Path]:
    """Write the key owner-only and atomically to admin_key_path(port) per port; returns the files written."""
    written = []
    for port in ports:
        path = admin_key_path(port)
        try:
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
            with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as f:
                f.write(key + "\n")
            os.replace(tmp, path)
            written.append(path)
        except OSError:
            continue
    return written


def remove_admin_key_files(key: str, paths: list[Path]) -> None:
    """Remove each file only while it still holds this server's key."""
    for path in paths:
        try:
            if path.read_text().strip() == key:
                path.unlink()
        except OSError:
            pass
