"""Per-step training losses of the whole workflow on the tiny set: `python -m tests.helpers.tiny_run OUT.json`.

Builds the tiny COCO set, serves it over HTTP on 127.0.0.1, runs `snakemake` for 2 epochs in blocks of 1 on the CPU,
and writes every step's loss (both blocks, in order) to OUT.json. Two checkouts give identical files when a change
leaves what training computes alone.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

from tests.helpers.archive_server import ArchiveServer
from tests.helpers.tiny_coco import make_archives, make_dataset
from tests.helpers.workflow import run_snakemake, tiny_config, write_config


def main() -> None:
    out = Path(sys.argv[1])
    tmp = Path(tempfile.mkdtemp(prefix="tiny_run-"))
    archives = make_archives(make_dataset(tmp / "tiny"), tmp / "archives")
    work = tmp / "work"
    work.mkdir()
    with ArchiveServer(tmp / "archives") as server:
        write_config(work, tiny_config(work, server.url, archives, epochs=2, epochs_per_block=1))
        result = run_snakemake(work)
    if result.returncode != 0:
        raise SystemExit(result.stdout[-4000:])
    blocks = [
        json.loads((work / "results" / "train" / b / "epochs.json").read_text()) for b in ("block_01", "block_02")
    ]
    out.write_text(json.dumps([loss for block in blocks for epoch in block for loss in epoch["loss"]]) + "\n")
    print(out.read_text(), end="")


if __name__ == "__main__":
    main()
