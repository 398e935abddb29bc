"""Checksum-verified, resumable downloads (for files torchvision does not know, e.g. the 300K
random images of Outlier Exposure).

Bytes go to ``<file>.partial``; an interrupted download resumes from there with an HTTP Range
request (or starts over when the server ignores it). The finished file is checked against its
md5 before it takes its final name, so a broken download is never mistaken for data.
"""

from __future__ import annotations

import http.client
import os
import urllib.error
import urllib.request
from pathlib import Path

from ccu.data.sources import (
    CorruptDataError,
    DataNotFoundError,
    downloads_allowed,
    file_digest,
)

CHUNK = 1 << 20


def md5(path: Path) -> str:
    return file_digest(path, "md5")


def download(url: str, dest: Path, md5sum: str, timeout: float = 60.0, progress=None) -> Path:
    """Download ``url`` to ``dest`` unless ``dest`` is already there with the right md5.

    Resumes ``dest.partial`` where a previous attempt stopped. Raises :class:`DataNotFoundError`
    when the server cannot be reached (offline: says where to put the file by hand) and
    :class:`CorruptDataError` when the finished file has the wrong md5 (the partial file is
    deleted, so the next call starts afresh). ``progress(done, total)`` is called per chunk.
    Processes downloading the same file take turns (a file lock beside it): the second finds
    the first's file and checks it.
    """
    from filelock import FileLock

    dest = Path(dest)
    if not dest.is_file() and downloads_allowed():
        dest.parent.mkdir(parents=True, exist_ok=True)
        with FileLock(str(dest) + ".lock"):
            return _download(url, dest, md5sum, timeout, progress)
    return _download(url, dest, md5sum, timeout, progress)


def verify(dest: Path, md5sum: str) -> Path:
    """``dest`` when its md5 is ``md5sum``; :class:`CorruptDataError` (truncated or altered)
    otherwise."""
    got = md5(dest)
    if got != md5sum:
        raise CorruptDataError(
            f"{dest} has md5 {got}, expected {md5sum}: truncated or altered. Delete it and load "
            "again to download it afresh."
        )
    return dest


def _download(url: str, dest: Path, md5sum: str, timeout: float, progress) -> Path:
    if dest.is_file():
        return verify(dest, md5sum)
    if not downloads_allowed():
        raise DataNotFoundError(
            f"{dest.name} is not at {dest}, and downloads are off here (mirror_sandbox)."
        )
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = dest.with_name(dest.name + ".partial")
    done = part.stat().st_size if part.is_file() else 0
    request = urllib.request.Request(url, headers={"Range": f"bytes={done}-"} if done else {})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            if done and response.status != 206:  # the server ignored the Range: start over
                done = 0
            length = response.headers.get("Content-Length")
            total = done + int(length) if length is not None else None
            with open(part, "ab" if done else "wb") as f:
                while block := response.read(CHUNK):
                    f.write(block)
                    done += len(block)
                    if progress is not None:
                        progress(done, total)
            if total is not None and done < total:
                raise DataNotFoundError(
                    f"the download of {url} stopped after {done} of {total} bytes; {part} keeps "
                    "them and the next attempt resumes from there."
                )
    except urllib.error.HTTPError as exc:
        if exc.code == 416 and done:  # nothing left to fetch: the partial file is complete
            pass
        else:
            raise DataNotFoundError(
                f"downloading {url} failed (HTTP {exc.code}: {exc.reason}). Download it by hand "
                f"and put it at {dest}."
            ) from exc
    # HTTPException: e.g. a transfer cut before its length (IncompleteRead)
    except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:
        raise DataNotFoundError(
            f"{dest.name} is not at {dest} and could not be downloaded from {url} ({exc}); "
            f"no internet? Download it on a machine with internet and copy it to {dest}. "
            f"{part.name} keeps what arrived; the next attempt resumes from it."
        ) from exc
    got = md5(part)
    if got != md5sum:
        part.unlink()
        raise CorruptDataError(
            f"the download of {url} has md5 {got}, expected {md5sum}; deleted it. Try again, or "
            f"download it by hand to {dest}."
        )
    os.replace(part, dest)
    return dest
