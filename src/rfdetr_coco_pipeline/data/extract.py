"""Extract one archive into the COCO layout, refusing members that would land outside their folder.

The archive unpacks into a hidden scratch folder beside the target and is moved into place only when complete, so a
killed or failed extraction never leaves a half-filled folder that looks done; the next run clears the scratch folder
and starts over. Runs that share the data folder take a lock per folder: the second waits, then uses the first one's
folder (a folder that was there before this run began is extracted again: the run was asked to, as after a corrupt
image). A record beside the folder (`.<folder>.extraction.json`) says which archive made it; extraction replaces only
a folder it made, and moves any other folder in its way aside (`.replaced/`) instead of deleting it. An archive that no
download of this workflow wrote (placed by hand) is MD5-checked first, and never deleted by extraction.
"""

from __future__ import annotations

import os
import shutil
import stat
import time
import zipfile
from collections.abc import Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path, PurePosixPath

from tqdm import tqdm

from rfdetr_coco_pipeline.common import StageError, log, md5_of_file, read_json, size, sync_folder, write_json
from rfdetr_coco_pipeline.data.download import checked_md5
from rfdetr_coco_pipeline.locks import waiting_lock
from rfdetr_coco_pipeline.settings import Settings, run_started

MEMBERS_PER_TASK = 256


def unsafe_members(infos: Iterable[zipfile.ZipInfo], folder: str) -> list[str]:
    """Members that are links, absolute, contain '..', or lie outside `folder/`, with the reason."""
    problems = []
    for info in infos:
        name = info.filename
        path = PurePosixPath(name.replace("\\", "/"))
        mode = info.external_attr >> 16
        if stat.S_ISLNK(mode):
            problems.append(f"{name} (a symbolic link)")
        elif path.is_absolute() or (len(name) > 1 and name[1] == ":"):
            problems.append(f"{name} (an absolute path)")
        elif ".." in path.parts:
            problems.append(f"{name} (contains '..')")
        elif not path.parts or path.parts[0] != folder:
            problems.append(f"{name} (outside {folder}/)")
    return problems


_zip: zipfile.ZipFile | None = None


def _open_archive(archive: str) -> None:
    global _zip
    _zip = zipfile.ZipFile(archive)


def _extract_members(names: Sequence[str], target: str) -> int:
    assert _zip is not None
    total = 0
    for name in names:
        _zip.extract(name, target)
        total += _zip.getinfo(name).file_size
    return total


def _batches(infos: Sequence[zipfile.ZipInfo], size: int) -> list[list[str]]:
    names = [info.filename for info in infos]
    return [names[i : i + size] for i in range(0, len(names), size)]


def record_path(final: Path) -> Path:
    """Where the extraction that made the folder `final` says so."""
    return final.with_name(f".{final.name}.extraction.json")


def made_here(final: Path) -> dict[str, object] | None:
    """The record of the extraction that made `final`, while `final` is still that folder; None for a folder that
    extraction did not make (placed by hand, left by an earlier version of the workflow, or replaced since)."""
    record = record_path(final)
    if not (final.is_dir() and record.is_file()):
        return None
    written = read_json(record)
    return written if written.get("inode") == final.stat().st_ino else None


def check_archive(archive: Path, md5: str, name: str) -> None:
    """An archive that this workflow's download did not write has its MD5 checked before it is used."""
    if checked_md5(archive) == md5:
        return
    log.info("%s was not downloaded by this workflow (or has changed since): checking its MD5", archive)
    got = md5_of_file(archive).hexdigest()
    if got != md5:
        raise StageError(
            f"{archive} has MD5 {got}, but archives.{name}.md5 in config.yaml says {md5}: it is not the archive the "
            "workflow expects. It is left where it is. Replace it with the right file, or delete it so that the "
            "workflow downloads the archive, then run snakemake again."
        )
    log.info("%s: MD5 %s as expected", archive, md5)


def move_aside(final: Path) -> Path:
    """Move a folder extraction did not make out of the way, keeping it (under `.replaced/` beside it)."""
    aside = final.parent / ".replaced" / f"{final.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    aside.parent.mkdir(parents=True, exist_ok=True)
    os.replace(final, aside)
    log.warning(
        "%s was in the way and was not made by this workflow's extraction: it is kept in %s (%s files). Delete it "
        "once you no longer need it.",
        final,
        aside,
        sum(1 for _ in aside.rglob("*")),
    )
    return aside


def extract(archive: Path, target: Path, folder: str, workers: int, md5: str = "", name: str = "<name>") -> dict:
    """Extract `archive` (whose members all lie under `folder/`) so that `target/folder` appears whole.

    With the archive's `md5`, a folder another run extracted from that archive since this run began is used as it
    is, and an archive placed by hand is checked first."""
    final = target / folder
    target.mkdir(parents=True, exist_ok=True)
    with waiting_lock(target / f".{folder}.lock", f"extracting {folder}", "data_dir"):
        done = made_here(final)
        began = run_started()
        if md5 and done and done.get("md5") == md5 and began is not None and float(done.get("finished", 0)) > began:
            log.info("%s is already extracted from %s (MD5 %s)", final, done.get("archive"), md5)
            return {"files": int(done["files"]), "bytes": int(done["bytes"])}
        if md5:
            check_archive(archive, md5, name)
        counts = unpack(archive, target, folder, workers)
        scratch = target / f".extracting-{folder}"
        if final.exists() and made_here(final) is None:
            move_aside(final)
        elif final.exists():  # an extraction of another archive (a changed url or md5): this workflow's to replace
            os.replace(final, scratch / "previous")
        os.replace(scratch / folder, final)
        write_json(
            record_path(final),
            {"archive": archive.name, "md5": md5, "inode": final.stat().st_ino, "finished": time.time(), **counts},
        )
        sync_folder(target)
        shutil.rmtree(scratch)
    log.info("Extracted %s into %s (%d files, %s)", archive.name, final, counts["files"], size(counts["bytes"]))
    return counts


def unpack(archive: Path, target: Path, folder: str, workers: int) -> dict[str, int]:
    """Unpack `archive` into the scratch folder `target/.extracting-<folder>/<folder>` (emptied first)."""
    scratch = target / f".extracting-{folder}"
    try:
        with zipfile.ZipFile(archive) as zf:
            infos = zf.infolist()
    except zipfile.BadZipFile as error:
        raise StageError(
            f"{archive} is not a readable zip archive ({error}): it is truncated or corrupt. Delete it and "
            "run snakemake again to download it afresh."
        ) from error
    problems = unsafe_members(infos, folder)
    if problems:
        shown = "\n  ".join(problems[:10])
        raise StageError(
            f"Refusing to extract {archive}: {len(problems)} member(s) would land outside "
            f"{target / folder}:\n  {shown}\nThis is not the official archive; check its url and md5 in config.yaml."
        )
    files = [info for info in infos if not info.is_dir()]
    total_bytes = sum(info.file_size for info in files)
    shutil.rmtree(scratch, ignore_errors=True)  # an extraction cut short: this workflow's own scratch
    scratch.mkdir(parents=True)
    # zipfile makes a member's folder when it finds it missing: two workers finding it missing at once both make it,
    # and one fails (FileExistsError). Every folder made here first, before any worker starts, leaves none to make.
    for parent in sorted({PurePosixPath(info.filename).parent for info in files}):
        (scratch / parent).mkdir(parents=True, exist_ok=True)
    log.info("Extracting %d files (%s) from %s with %d workers", len(files), size(total_bytes), archive, workers)
    try:
        with (
            ProcessPoolExecutor(workers, initializer=_open_archive, initargs=(str(archive),)) as pool,
            tqdm(total=total_bytes, unit="B", unit_scale=True, desc=archive.name, mininterval=2.0) as bar,
        ):
            tasks = [pool.submit(_extract_members, batch, str(scratch)) for batch in _batches(files, MEMBERS_PER_TASK)]
            for task in as_completed(tasks):
                bar.update(task.result())
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError) as error:
        raise StageError(
            f"{archive} is damaged ({error}). Delete it and run snakemake again to download it afresh."
        ) from error
    (scratch / folder).mkdir(exist_ok=True)  # an archive of nothing but files still yields its folder
    return {"files": len(files), "bytes": total_bytes}


def extract_archive(settings: Settings, archive: Path, output: Path, workers: int) -> dict:
    """Extract `archive` into the dataset folder `output`, with the MD5 the settings give the archive of that folder."""
    (configured,) = [a for a in settings.archives if a.folder == output.name]
    return extract(archive, output.parent, output.name, workers, configured.md5, configured.name)
