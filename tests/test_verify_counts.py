"""The count-verify stage: counts, annotation files, annotated images, decodable JPEGs."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from pipeline.common import StageError
from scripts.verify_counts import verify_dataset

EXPECTED = {"train2017": 8, "val2017": 4}


@pytest.fixture
def dataset(tiny_dataset: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(tiny_dataset, tmp_path / "coco2017"))


def test_a_complete_dataset_passes_and_is_reported(dataset):
    report = verify_dataset(dataset, EXPECTED, decode=True, workers=2)
    assert report["splits"]["train2017"]["images"] == 8
    assert report["splits"]["val2017"]["annotated_images"] == 4
    assert report["splits"]["val2017"]["annotations"] > 0


@pytest.mark.parametrize("delta", [-1, +1])
def test_a_count_off_by_one_names_the_split_both_counts_and_the_fix(dataset, delta):
    if delta < 0:
        next((dataset / "val2017").glob("*.jpg")).unlink()
    else:
        shutil.copy(next((dataset / "val2017").glob("*.jpg")), dataset / "val2017" / "extra.jpg")
    with pytest.raises(StageError) as error:
        verify_dataset(dataset, EXPECTED, decode=False, workers=1)
    message = str(error.value)
    assert f"val2017: found {4 + delta} images" in message and "expected 4" in message
    assert "--forcerun" in message


def test_a_missing_annotation_file_is_named(dataset):
    (dataset / "annotations" / "instances_val2017.json").unlink()
    with pytest.raises(StageError, match=r"instances_val2017.json is missing"):
        verify_dataset(dataset, EXPECTED, decode=False, workers=1)


def test_an_annotation_file_that_is_not_json_is_named(dataset):
    (dataset / "annotations" / "instances_train2017.json").write_text('{"images": [')
    with pytest.raises(StageError, match=r"instances_train2017.json is not valid JSON"):
        verify_dataset(dataset, EXPECTED, decode=False, workers=1)


def test_an_annotated_image_that_is_missing_is_named(dataset):
    victim = sorted((dataset / "train2017").glob("*.jpg"))[0]
    victim.rename(victim.with_suffix(".jpeg"))  # the count of .jpg files drops too, so compensate:
    with pytest.raises(StageError, match="found 7 images"):
        verify_dataset(dataset, EXPECTED, decode=False, workers=1)
    shutil.copy(sorted((dataset / "train2017").glob("*.jpg"))[0], dataset / "train2017" / "unlisted.jpg")
    with pytest.raises(StageError, match=rf"1 annotated image\(s\) are missing .*{victim.name}"):
        verify_dataset(dataset, EXPECTED, decode=False, workers=1)


def test_a_corrupt_jpeg_is_caught_by_decoding(dataset):
    victim = sorted((dataset / "val2017").glob("*.jpg"))[1]
    victim.write_bytes(victim.read_bytes()[: victim.stat().st_size // 2])
    verify_dataset(dataset, EXPECTED, decode=False, workers=1)  # counts alone cannot see it
    with pytest.raises(StageError, match=rf"val2017: 1 image\(s\) do not decode: {victim.name}"):
        verify_dataset(dataset, EXPECTED, decode=True, workers=2)
