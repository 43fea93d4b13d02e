"""Small self-contained HTML pages of tables, which `snakemake --report` shows inline (it renders HTML and images,
but offers CSV and JSON files only as downloads)."""

from __future__ import annotations

import html
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

STYLE = (
    "body{font-family:sans-serif;margin:1.5em;color:#222}h1{font-size:1.3em}h2{font-size:1.1em;margin-top:1.5em}"
    "table{border-collapse:collapse;font-size:0.9em}th,td{border:1px solid #bbb;padding:3px 8px}th{background:#eef}"
)


def decimals(column: str) -> int:
    """How many decimals a number of this column shows: COCO's three for AP, AR and mAP, one for seconds and rates
    (and anything else), three for losses."""
    words = re.split(r"[^a-z0-9]+", column.lower())
    return 3 if any(word.startswith(("ap", "ar", "map")) or word == "loss" for word in words) else 1


def table(rows: Sequence[Mapping[str, Any]] | pd.DataFrame) -> str:
    """An HTML table (pandas' `to_html`), each float column with its column's decimals (`decimals`)."""
    frame = rows if isinstance(rows, pd.DataFrame) else pd.DataFrame(list(rows))
    formatters = {
        column: f"{{:.{decimals(str(column))}f}}".format
        for column in frame.columns
        if pd.api.types.is_float_dtype(frame[column])
    }
    return frame.to_html(index=False, formatters=formatters, na_rep="", border=0)


def key_values(values: Mapping[str, Any]) -> str:
    """A two-column table of names and values."""
    return table([{"": name, "value": "" if value is None else str(value)} for name, value in values.items()])


def write_page(path: Path, title: str, sections: Sequence[tuple[str, str]]) -> None:
    """A page with `title` and one heading and HTML body per section."""
    parts = "".join(f"<h2>{html.escape(heading)}</h2>{body}" for heading, body in sections)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
        f"<style>{STYLE}</style></head><body><h1>{html.escape(title)}</h1>{parts}</body></html>\n"
    )
