"""Export the run's best weights for deployment with rfdetr's own `export()` (the export_model rule).

The weights are the last block's `best.pth` (what the evaluate stage scores). Each format of `export.formats` is
written to `<results>/export/model.<format>`; ONNX is a static graph of batch 1 at the training resolution, inputs
normalised as for training (ImageNet mean and std), outputs `dets` (boxes, cxcywh relative) and `labels` (class
logits). Shown by `tests/test_pipeline.py::test_the_exported_onnx_model_gives_the_pytorch_models_boxes_and_scores`
(onnxruntime against the PyTorch model of the same weights) and
`tests/test_pipeline.py::test_without_the_onnx_extra_the_export_stops_naming_it`.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
from pathlib import Path

from pipeline.common import StageError, log, run_main, size
from pipeline.export_formats import EXTRA, missing_message, missing_modules
from pipeline.rfdetr_call import load_for_inference


def export_weights(weights: Path, fmt: str, output: Path) -> Path:
    """rfdetr's `export()` of `weights` in `fmt`, moved to `output`; StageError naming the extra when a package for
    that format is missing."""
    missing = missing_modules(fmt)
    if missing:
        raise StageError(missing_message(fmt, missing))
    model = load_for_inference(weights)
    output.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=output.parent) as scratch:
        try:
            written = Path(model.export(output_dir=scratch, format=fmt, verbose=False))
        except ImportError as error:
            raise StageError(
                f"Exporting to {fmt} needs packages that are not installed ({error}). Install them with "
                f"pip install -e '.[{EXTRA[fmt]}]', or set export.formats: [] in config.yaml to skip the export."
            ) from error
        shutil.move(written, output)
    log.info("Exported %s to %s (%s)", weights, output, size(output.stat().st_size))
    return output


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--weights", required=True, type=Path, help="the last block's best.pth")
    parser.add_argument("--format", required=True, choices=sorted(EXTRA))
    parser.add_argument("--output", required=True, type=Path)
    args = parser.parse_args()
    export_weights(args.weights, args.format, args.output)


if __name__ == "__main__":
    run_main(main)
