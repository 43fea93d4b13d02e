"""Extract one archive into the COCO layout, refusing members that would land outside their folder.

The archive unpacks into a hidden scratch folder beside the target and is moved into place only
when complete, so a killed or failed extraction never leaves a half-filled folder that looks done;
the next run clears the scratch folder and starts over.
"""

from __future__ import annotations

import os
import shutil
import stat
import zipfile
from collections.abc import Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path, PurePosixPath

from tqdm import tqdm

from rfdetr_coco_pipeline.common import StageError, log

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


def extract(archive: Path, target: Path, folder: str, workers: int) -> dict[str, int]:
    """Extract `archive` (whose members all lie under `folder/`) so that `target/folder` appears whole."""
    final = target / folder
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
            f"{final}:\n  {shown}\nThis is not the official archive; check its url and md5 in config.yaml."
        )
    files = [info for info in infos if not info.is_dir()]
    total_bytes = sum(info.file_size for info in files)
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    log.info(
        "Extracting %d files (%.1f MB) from %s with %d workers",
        len(files),
        total_bytes / 1e6,
        archive,
        workers,
    )
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
    if final.exists():
        shutil.rmtree(final)
    os.replace(scratch / folder, final)
    shutil.rmtree(scratch)
    log.info("Extracted %s into %s", archive.name, final)
    return {"files": len(files), "bytes": total_bytes}
