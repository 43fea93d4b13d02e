"""The extract stage on real zip files: the COCO layout, refused members, damaged archives, safe reruns."""

from __future__ import annotations

import re
import stat
import zipfile
from pathlib import Path

import pytest

from rfdetr_coco_pipeline.common import StageError
from rfdetr_coco_pipeline.data.extract import extract


def test_extraction_yields_the_folder_with_every_member(archives, tiny_dataset, tmp_path):
    result = extract(archives["train2017"]["path"], tmp_path, "train2017", workers=2)
    extracted = sorted(p.name for p in (tmp_path / "train2017").iterdir())
    assert extracted == sorted(p.name for p in (tiny_dataset / "train2017").iterdir())
    assert result["files"] == len(extracted)
    assert all(
        (tmp_path / "train2017" / n).read_bytes() == (tiny_dataset / "train2017" / n).read_bytes() for n in extracted
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train2017"]  # no scratch folder left behind


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
    assert list(target.iterdir()) == []
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
