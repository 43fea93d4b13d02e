"""The count-verify stage: counts, annotation files, annotated images, decodable JPEGs."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from rfdetr_coco_pipeline.common import StageError
from rfdetr_coco_pipeline.data.verify import verify_dataset

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


def test_image_files_the_annotations_do_not_list_stop_the_run_or_are_reported_with_warn(dataset):
    shutil.copy(next((dataset / "val2017").glob("*.jpg")), dataset / "val2017" / "not_in_the_json.jpg")
    expected = {**EXPECTED, "val2017": 5}  # the count of files is right: the file is just not annotated
    with pytest.raises(StageError) as error:
        verify_dataset(dataset, expected, decode=False, workers=1)
    assert "val2017: 1 image file(s)" in str(error.value) and "not_in_the_json.jpg" in str(error.value)
    assert "verify.unlisted_images: warn" in str(error.value)
    report = verify_dataset(dataset, expected, decode=False, workers=1, unlisted_policy="warn")["splits"]["val2017"]
    assert (report["images"], report["annotated_images"], report["unlisted_images"]) == (5, 4, 1)
    assert report["unlisted_examples"] == ["not_in_the_json.jpg"]


def test_images_listed_without_annotations_are_counted_and_fine(dataset):
    annotation_file = dataset / "annotations" / "instances_val2017.json"
    annotations = json.loads(annotation_file.read_text())
    first = annotations["images"][0]["id"]
    annotations["annotations"] = [a for a in annotations["annotations"] if a["image_id"] != first]
    annotation_file.write_text(json.dumps(annotations))
    report = verify_dataset(dataset, EXPECTED, decode=False, workers=1)["splits"]["val2017"]
    assert (report["images"], report["annotated_images"], report["images_without_annotations"]) == (4, 4, 1)
    assert report["unlisted_images"] == 0
