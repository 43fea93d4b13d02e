"""The extract stage on real zip files: the COCO layout, refused members, damaged archives, safe reruns."""

from __future__ import annotations

import re
import stat
import time
import zipfile
from pathlib import Path

import pytest

from rfdetr_coco_pipeline.common import StageError
from rfdetr_coco_pipeline.data.extract import extract, record_path
from rfdetr_coco_pipeline.settings import RUN_STARTED_ENV


def test_extraction_yields_the_folder_with_every_member(archives, tiny_dataset, tmp_path):
    result = extract(archives["train2017"]["path"], tmp_path, "train2017", workers=2)
    extracted = sorted(p.name for p in (tmp_path / "train2017").iterdir())
    assert extracted == sorted(p.name for p in (tiny_dataset / "train2017").iterdir())
    assert result["files"] == len(extracted)
    assert all(
        (tmp_path / "train2017" / n).read_bytes() == (tiny_dataset / "train2017" / n).read_bytes() for n in extracted
    )
    # no scratch folder left behind; the lock and the record of what made the folder beside it
    assert sorted(p.name for p in tmp_path.iterdir()) == [".train2017.extraction.json", ".train2017.lock", "train2017"]


def test_a_rerun_after_a_killed_extraction_starts_clean(archives, tmp_path):
    scratch = tmp_path / ".extracting-val2017" / "val2017"
    scratch.mkdir(parents=True)
    (scratch / "half-written.jpg").write_bytes(b"\xff\xd8 partial")
    extract(archives["val2017"]["path"], tmp_path, "val2017", workers=1)
    assert not (tmp_path / "val2017" / "half-written.jpg").exists()
    assert not (tmp_path / ".extracting-val2017").exists()


def make_zip(path: Path, members: dict[str, bytes], links: dict[str, str] | None = None) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in members.items():
            zf.writestr(name, data)
        for name, target in (links or {}).items():
            info = zipfile.ZipInfo(name)
            info.external_attr = (stat.S_IFLNK | 0o777) << 16
            zf.writestr(info, target)
    return path


@pytest.mark.parametrize(
    ("members", "links", "reason"),
    [
        ({"val2017/../../evil.txt": b"x"}, None, "contains '..'"),
        ({"/etc/evil.txt": b"x"}, None, "an absolute path"),
        ({"val2017/ok.jpg": b"x"}, {"val2017/link.jpg": "/etc/passwd"}, "a symbolic link"),
        ({"elsewhere/file.jpg": b"x"}, None, "outside val2017/"),
    ],
)
def test_members_that_would_land_outside_the_target_are_refused(tmp_path, members, links, reason):
    archive = make_zip(tmp_path / "bad.zip", members, links)
    target = tmp_path / "dataset"
    target.mkdir()
    with pytest.raises(StageError, match=rf"(?s)Refusing to extract .*{re.escape(reason)}"):
        extract(archive, target, "val2017", workers=1)
    assert [p.name for p in target.iterdir()] == [".val2017.lock"]
    assert not (tmp_path / "evil.txt").exists()


def test_a_truncated_archive_is_reported_with_what_to_do(archives, tmp_path):
    data = archives["train2017"]["path"].read_bytes()
    truncated = tmp_path / "train2017.zip"
    truncated.write_bytes(data[: len(data) // 2])
    target = tmp_path / "dataset"
    target.mkdir()
    with pytest.raises(StageError, match="truncated or corrupt. Delete it and run snakemake again"):
        extract(truncated, target, "train2017", workers=1)
    assert not (target / "train2017").exists()


def test_a_folder_extraction_did_not_make_is_moved_aside_never_deleted(archives, tmp_path, caplog):
    """A user's own val2017 in the way (no record of an extraction): kept, whole, under .replaced/, and said so."""
    mine = tmp_path / "val2017"
    mine.mkdir()
    (mine / "my-notes.txt").write_text("the user's file")
    extract(archives["val2017"]["path"], tmp_path, "val2017", workers=1, md5=archives["val2017"]["md5"])
    (aside,) = (tmp_path / ".replaced").iterdir()
    assert aside.name.startswith("val2017-") and (aside / "my-notes.txt").read_text() == "the user's file"
    assert not (mine / "my-notes.txt").exists() and any(mine.glob("*.jpg"))
    assert f"it is kept in {aside}" in caplog.text and "Delete it once you no longer need it" in caplog.text


def test_a_folder_extracted_during_this_run_is_used_and_an_older_one_is_extracted_again(
    archives, tmp_path, monkeypatch
):
    """Another run sharing data_dir extracted the folder since this run began: used as it is. A folder from before
    the run began (a rerun asked for, as after a corrupt image) or from another archive: this workflow's, replaced."""
    val = archives["val2017"]
    monkeypatch.setenv(RUN_STARTED_ENV, str(time.time()))
    extract(val["path"], tmp_path, "val2017", workers=1, md5=val["md5"])
    folder = tmp_path / "val2017"
    (folder / "added-since.txt").write_text("x")  # shows whether the folder was extracted again
    result = extract(val["path"], tmp_path, "val2017", workers=1, md5=val["md5"])
    assert (folder / "added-since.txt").exists() and result["files"] == len(list(folder.glob("*.jpg")))
    monkeypatch.setenv(RUN_STARTED_ENV, str(time.time() + 1))  # a later run, asked to extract again
    extract(val["path"], tmp_path, "val2017", workers=1, md5=val["md5"])
    assert not (folder / "added-since.txt").exists()
    (folder / "added-since.txt").write_text("x")
    record = record_path(folder)
    monkeypatch.setenv(RUN_STARTED_ENV, "0")
    record.write_text(record.read_text().replace(val["md5"], "0" * 32))  # made from another archive
    extract(val["path"], tmp_path, "val2017", workers=1, md5=val["md5"])
    assert not (folder / "added-since.txt").exists() and not (tmp_path / ".replaced").exists()


def test_an_archive_placed_by_hand_is_md5_checked_first_and_kept_when_it_does_not_match(archives, tmp_path):
    placed = tmp_path / "archives" / "val2017.zip"
    placed.parent.mkdir()
    placed.write_bytes(archives["train2017"]["path"].read_bytes())  # the wrong file under the right name
    target = tmp_path / "coco2017"
    with pytest.raises(StageError) as error:
        extract(placed, target, "val2017", workers=1, md5=archives["val2017"]["md5"], name="val2017")
    message = str(error.value)
    assert f"has MD5 {archives['train2017']['md5']}, but archives.val2017.md5 in config.yaml says" in message
    assert "It is left where it is" in message and placed.is_file()
    assert not (target / "val2017").exists()
