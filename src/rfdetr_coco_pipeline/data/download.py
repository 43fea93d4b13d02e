"""Download one archive: free-disk check, HTTP Range resume, bounded retries with back-off, MD5 check.

The bytes go to `<output>.part`, which is not a declared output, so it survives a failed or killed job and the next
try resumes it. The archive appears under its final name only once its MD5 matches, together with a record of what
was checked (`.downloaded/<archive>.json`); an archive without a matching record was placed by hand, and is
MD5-checked before it is extracted. A download whose MD5 does not match is kept aside, and is not fetched again while
the server describes the same file. Runs that share the data folder take a lock per archive: the second waits, then
uses what the first fetched.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import socket
import urllib.parse
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import requests
import tenacity
import urllib3
from tqdm import tqdm

from rfdetr_coco_pipeline.common import StageError, log, md5_of_file, read_json, size, sync_folder, write_json
from rfdetr_coco_pipeline.locks import waiting_lock
from rfdetr_coco_pipeline.settings import Archive, Settings

CHUNK_BYTES = 1 << 20


class TransientError(Exception):
    """A failure worth another try: connection trouble, HTTP 5xx, a transfer cut short."""


def part_path(output: Path) -> Path:
    return output.with_name(output.name + ".part")


def later_needs(archives: Sequence[Archive], name: str, keep_archives: bool) -> int:
    """Disk the archives after `name` (in config order) will take: all their extracted data, plus either
    all their archives (kept) or the largest one (each is deleted once extracted, before the next)."""
    names = [archive.name for archive in archives]
    later = archives[names.index(name) + 1 :]
    sizes = [archive.size_bytes for archive in later]
    archive_room = sum(sizes) if keep_archives else max(sizes, default=0)
    return sum(archive.extracted_bytes for archive in later) + archive_room


def disk_needed(remaining_bytes: int, extracted_bytes: int, later_bytes: int, headroom_bytes: int) -> int:
    """Free bytes this download needs: the rest of the archive, its extraction, what the later archives
    will need, and the headroom."""
    return remaining_bytes + extracted_bytes + later_bytes + headroom_bytes


def check_free_disk(folder: Path, needed: int, breakdown: str) -> None:
    free = shutil.disk_usage(folder).free
    if needed > free:
        raise StageError(
            f"Not enough free disk in {folder}: the download and extraction need {size(needed)} "
            f"({breakdown}), but only {size(free)} is free. Free up space, or set data_dir in config.yaml "
            "to a larger disk, then run snakemake again."
        )
    log.info("Free disk in %s: %s; needed: %s (%s)", folder, size(free), size(needed), breakdown)


def connection_problem(url: str, error: requests.RequestException) -> str:
    """What went wrong with a request, as a person says it: no connection to the host (and why), or the error."""
    if not isinstance(error, requests.ConnectionError) or isinstance(error, requests.exceptions.ReadTimeout):
        return f"{url}: {error}"
    host = urllib.parse.urlsplit(url).hostname or url
    chain: list[BaseException] = []
    cause: BaseException | None = error
    while cause is not None and cause not in chain:
        chain.append(cause)
        cause = cause.__cause__ or cause.__context__
        cause = cause.reason if isinstance(cause, urllib3.exceptions.MaxRetryError) else cause
    if any(isinstance(c, (urllib3.exceptions.NameResolutionError, socket.gaierror)) for c in chain):
        why = "its name does not resolve"
    elif any(isinstance(c, ConnectionRefusedError) for c in chain):
        why = "the connection was refused"
    elif any(isinstance(c, (requests.exceptions.ConnectTimeout, TimeoutError)) for c in chain):
        why = "the connection timed out"
    else:
        why = str(error)
    return f"no connection to {host} ({why})"


@dataclass
class Transfer:
    url: str
    part: Path
    timeout: float

    def describe(self) -> dict[str, Any]:
        """What a HEAD request says of the file: its size and, where the server gives them, ETag and
        Last-Modified (None when not said)."""
        try:
            response = requests.head(self.url, timeout=self.timeout, allow_redirects=True)
        except requests.RequestException as error:
            raise TransientError(connection_problem(self.url, error)) from error
        raise_for_status(self.url, response)
        length = response.headers.get("Content-Length")
        return {
            "bytes": int(length) if length is not None else None,
            "etag": response.headers.get("ETag"),
            "last_modified": response.headers.get("Last-Modified"),
        }

    def fetch(self, digest_box: list[hashlib._Hash]) -> None:
        """One try: append the missing bytes to the part file, hashing as they arrive."""
        have = self.part.stat().st_size if self.part.exists() else 0
        headers = {"Range": f"bytes={have}-"} if have else {}
        try:
            response = requests.get(self.url, headers=headers, stream=True, timeout=self.timeout)
        except requests.RequestException as error:
            raise TransientError(connection_problem(self.url, error)) from error
        with response:
            if response.status_code == 416 and have:
                # Nothing left to send: the part file already holds the whole archive.
                digest_box[0] = md5_of_file(self.part)
                return
            raise_for_status(self.url, response)
            if have and response.status_code == 206:
                log.info("Resuming %s at %s", self.part.name, size(have))
                digest = md5_of_file(self.part)
                mode = "ab"
            else:
                if have:
                    log.warning("The server ignored the Range request; restarting %s from byte 0", self.url)
                have, digest, mode = 0, hashlib.md5(), "wb"
            length = response.headers.get("Content-Length")
            total = have + int(length) if length is not None else None
            received = 0
            with (
                open(self.part, mode) as out,
                tqdm(
                    total=total,
                    initial=have,
                    unit="B",
                    unit_scale=True,
                    unit_divisor=1024,
                    desc=self.part.name.removesuffix(".part"),
                    mininterval=2.0,
                ) as bar,
            ):
                try:
                    # read1 hands over whatever has arrived, so a dropped connection loses no received byte.
                    while chunk := response.raw.read1(CHUNK_BYTES):
                        out.write(chunk)
                        digest.update(chunk)
                        received += len(chunk)
                        bar.update(len(chunk))
                except (requests.RequestException, urllib3.exceptions.HTTPError) as error:
                    # A local write error (a full disk) is an OSError, and is not retried.
                    raise TransientError(f"{self.url}: transfer cut after {size(have + received)}") from error
            if length is not None and received < int(length):
                raise TransientError(f"{self.url}: transfer cut after {size(have + received)}")
            digest_box[0] = digest


def raise_for_status(url: str, response: requests.Response) -> None:
    code = response.status_code
    if code >= 500 or code in (408, 429):
        raise TransientError(f"{url}: HTTP {code} {response.reason}")
    if code >= 400 and code != 416:
        raise StageError(
            f"{url}: HTTP {code} {response.reason}. Check the archive's url in config.yaml "
            "(archives.<name>.url) and that the server is reachable, then run snakemake again."
        )


def record_path(archive: Path) -> Path:
    """Where the download of `archive` records what it checked."""
    return archive.parent / ".downloaded" / f"{archive.name}.json"


def checked_md5(archive: Path) -> str | None:
    """The MD5 a download of this workflow checked `archive` against, while the file is still the one it wrote (the
    same inode and size; not the modification time, which Snakemake sets after each job); None for a file it did not
    write: one placed by hand, or replaced since."""
    record = record_path(archive)
    if not (archive.is_file() and record.is_file()):
        return None
    found, written = archive.stat(), read_json(record)
    same_file = written.get("bytes") == found.st_size and written.get("inode") == found.st_ino
    return written.get("md5") if same_file else None


def record_download(part: Path, archive: Path, url: str, md5: str) -> None:
    """Record the checked download, then give it its final name: the archive never appears without its record (the
    rename keeps the inode and size the record holds)."""
    found = part.stat()
    write_json(record_path(archive), {"url": url, "md5": md5, "bytes": found.st_size, "inode": found.st_ino})
    os.replace(part, archive)
    sync_folder(archive.parent)


def quarantine_paths(output: Path) -> tuple[Path, Path]:
    """Where a download whose MD5 did not match is kept aside (not a workflow output), and its record."""
    folder = output.parent / ".quarantine"
    return folder / output.name, folder / f"{output.name}.json"


def check_quarantine(output: Path, url: str, md5: str, remote: dict[str, Any], archive: str) -> None:
    """Stop without fetching when the file kept aside from an earlier try is, by the server's own description, what
    it would send again for the same configured MD5: the configured MD5 is then probably wrong."""
    kept, kept_record = quarantine_paths(output)
    if not (kept.is_file() and kept_record.is_file()):
        return
    record = read_json(kept_record)
    same = record["url"] == url and record["expected"] == md5 and record["remote"] == remote
    if same:
        raise StageError(
            f"{output.name}: the server keeps sending the same content: the download kept aside in {kept} has MD5 "
            f"{record['got']}, and archives.{archive}.md5 in config.yaml says {md5}. The server describes the file "
            f"as it did then ({remote['bytes']} bytes), so it was not fetched again: the configured md5 is "
            f"probably wrong. Fix it, or delete {kept} to fetch once more anyway, and run snakemake again."
        )


def download(
    url: str,
    output: Path,
    md5: str,
    *,
    attempts: int,
    backoff_seconds: float,
    max_backoff_seconds: float,
    timeout: float,
    extracted_bytes: int = 0,
    later_bytes: int = 0,
    headroom_bytes: int = 0,
    archive: str = "<name>",
) -> None:
    """Fetch `url` to `output`, resuming `<output>.part`: check the disk, fetch with retries, check the MD5 and
    record it, or keep a mismatching file aside; raise StageError on a final failure."""
    output.parent.mkdir(parents=True, exist_ok=True)
    transfer = Transfer(url, part_path(output), timeout)
    retrying = tenacity.Retrying(
        stop=tenacity.stop_after_attempt(attempts),
        wait=tenacity.wait_exponential(multiplier=backoff_seconds, max=max_backoff_seconds),
        retry=tenacity.retry_if_exception_type(TransientError),
        before_sleep=lambda state: log.warning(
            "Try %d of %d failed: %s; retrying in %.0f s",
            state.attempt_number,
            attempts,
            state.outcome.exception(),
            state.next_action.sleep,
        ),
        reraise=True,
    )
    digest_box: list[hashlib._Hash] = [hashlib.md5()]
    try:
        remote = retrying(transfer.describe)
        check_quarantine(output, url, md5, remote, archive)
        remote_size = remote["bytes"]
        have = transfer.part.stat().st_size if transfer.part.exists() else 0
        remaining = max(0, remote_size - have) if remote_size is not None else 0
        needed = disk_needed(remaining, extracted_bytes, later_bytes, headroom_bytes)
        check_free_disk(
            output.parent,
            needed,
            f"{size(remaining)} left to fetch, {size(extracted_bytes)} to extract it, {size(later_bytes)} "
            f"for the archives after it, {size(headroom_bytes)} headroom",
        )
        retrying(transfer.fetch, digest_box)
    except TransientError as error:
        kept = transfer.part.stat().st_size if transfer.part.exists() else 0
        if kept:
            what_is_left = f"The partial file {transfer.part} ({size(kept)}) is kept; run snakemake again to resume it."
        else:
            what_is_left = "Nothing was downloaded; run snakemake again when the cause is fixed."
        advice = (
            f"Check the network, or archives.{archive}.url in config.yaml. "
            if str(error).startswith("no connection to")
            else ""
        )
        raise StageError(f"Download failed after {attempts} tries: {error}. {advice}{what_is_left}") from error
    got = digest_box[0].hexdigest()
    kept, kept_record = quarantine_paths(output)
    if got != md5:
        kept.parent.mkdir(parents=True, exist_ok=True)
        os.replace(transfer.part, kept)
        write_json(kept_record, {"url": url, "expected": md5, "got": got, "remote": remote})
        raise StageError(
            f"{output.name}: MD5 mismatch: expected {md5}, got {got}. The file is kept aside in {kept} (never "
            "used). Run snakemake again: it fetches the archive afresh if the server now describes another file, "
            f"and otherwise stops without fetching, since archives.{archive}.md5 is then probably wrong."
        )
    kept.unlink(missing_ok=True)
    kept_record.unlink(missing_ok=True)
    record_download(transfer.part, output, url, md5)
    log.info("%s complete, MD5 %s", output, got)


def download_archive(settings: Settings, name: str, output: Path) -> None:
    """Download the archive `name` of the settings to `output`, with the settings' retries and disk headroom.
    Another run downloading the same file is waited for, and what it fetched is used when it has this MD5."""
    archive = settings.archive(name)
    output.parent.mkdir(parents=True, exist_ok=True)
    with waiting_lock(output.parent / f".{output.name}.lock", f"downloading {output.name}", "data_dir"):
        if checked_md5(output) == archive.md5:
            log.info("%s is already downloaded (MD5 %s checked when it was fetched)", output, archive.md5)
            return
        fetch_archive(settings, name, output)


def fetch_archive(settings: Settings, name: str, output: Path) -> None:
    """`download` with the settings' url, MD5, retries and disk headroom for the archive `name`."""
    archive, retries = settings.archive(name), settings.download
    download(
        archive.url,
        output,
        archive.md5,
        attempts=retries.attempts,
        backoff_seconds=retries.backoff_seconds,
        max_backoff_seconds=retries.max_backoff_seconds,
        timeout=retries.timeout_seconds,
        extracted_bytes=archive.extracted_bytes,
        later_bytes=later_needs(settings.archives, name, settings.extract.keep_archives),
        headroom_bytes=int(retries.disk_headroom_gb * 2**30),
        archive=name,
    )
