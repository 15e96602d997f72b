"""Files and directories written whole or not at all: build the new one next to the old, then swap."""

from __future__ import annotations

import os
import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator


@contextmanager
def replacing_dir(dest: Path) -> Iterator[Path]:
    """Yield a path beside `dest` to build the new directory in; it replaces `dest` only if the block succeeds."""
    dest = Path(dest)
    tmp = dest.parent / f".{dest.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    dest.parent.mkdir(parents=True, exist_ok=True)
    try:
        yield tmp
        old = dest.parent / f".{dest.name}.old-{os.getpid()}"
        if dest.exists():
            os.replace(dest, old)
        os.replace(tmp, dest)
        shutil.rmtree(old, ignore_errors=True)
    except OSError as e:  # name the user's directory, not the temporary one
        shutil.rmtree(tmp, ignore_errors=True)
        if e.filename and str(e.filename).startswith(str(tmp)):
            raise type(e)(e.errno, e.strerror, str(dest)) from e
        raise
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def write_atomic(path: Path, data: bytes | str) -> None:
    """Write via a temporary file and rename, so path never holds a part."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_bytes(data.encode() if isinstance(data, str) else data)
    os.replace(tmp, path)
