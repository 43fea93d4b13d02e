"""Export the run's best weights for deployment with rfdetr's own `export()` (the export_model rule).

The weights are the last block's `best.pth` (what the evaluate stage scores). Each format of `export.formats` is
written to `<results>/export/model.<format>`; ONNX is a static graph of batch 1 at the training resolution, inputs
normalised as for training (ImageNet mean and std), outputs `dets` (boxes, cxcywh relative) and `labels` (class
logits). A format whose packages are missing is named, with the extra that installs them, when the workflow starts
(a warning) and by the export itself (an error).
"""

from __future__ import annotations

import importlib.util
import shutil
import tempfile
from pathlib import Path

from rfdetr_coco_pipeline.common import StageError, log, size

EXTRA = {"onnx": "onnx"}  # format -> the pyproject extra that installs what rfdetr needs for it
NEEDS = {"onnx": ("onnx",)}  # format -> the modules rfdetr's export imports for it


def missing_modules(fmt: str) -> list[str]:
    """The modules `fmt`'s export needs that this interpreter cannot import."""
    missing = []
    for module in NEEDS[fmt]:
        try:
            if importlib.util.find_spec(module) is None:
                missing.append(module)
        except (ImportError, ValueError):  # a module set to None in sys.modules, or without a spec
            missing.append(module)
    return missing


def missing_message(fmt: str, missing: list[str]) -> str:
    return (
        f"Exporting to {fmt} needs {', '.join(missing)}, which is not installed. Install it with "
        f"pip install -e '.[{EXTRA[fmt]}]', or set export.formats: [] in config.yaml to skip the export."
    )


def export_weights(weights: Path, fmt: str, output: Path) -> Path:
    """rfdetr's `export()` of `weights` in `fmt`, moved to `output`; StageError naming the extra when a package for
    that format is missing."""
    from rfdetr_coco_pipeline.training.rfdetr_call import load_for_inference

    if missing := missing_modules(fmt):
        raise StageError(missing_message(fmt, missing))
    model = load_for_inference(weights)
    output.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=output.parent) as scratch:
        try:
            written = Path(model.export(output_dir=scratch, format=fmt, verbose=False))
        except ImportError as error:
            raise StageError(f"{missing_message(fmt, [str(error)])}") from error
        shutil.move(written, output)
    log.info("Exported %s to %s (%s)", weights, output, size(output.stat().st_size))
    return output
