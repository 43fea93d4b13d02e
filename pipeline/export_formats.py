"""The export formats the workflow wires (`export.formats`), the extra that installs what rfdetr needs for each,
and whether that is installed here: the export stage stops on it, and planning warns about it early. Shown by
`tests/test_pipeline.py::test_without_the_onnx_extra_the_export_stops_naming_it`."""

from __future__ import annotations

import importlib.util

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
