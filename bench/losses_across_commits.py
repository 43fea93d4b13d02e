"""The train rule's per-step losses at several commits, on one tiny set: identical numbers show that a change kept
what training computes.

    python -m bench.losses_across_commits c28762d HEAD [--epochs 2] [--out DIR]

For each commit: a detached git worktree, that commit's own tiny-config helper (`tests/helpers/workflow.py`, or
`tests/workflow.py` in older commits) pointed at one archive server on 127.0.0.1, and that commit's `snakemake` up
to its training block (all epochs in one block, on the CPU, at resolution 64). Prints every commit's per-step
losses and whether they are identical to the first commit's; exits 1 when they are not. Writes `losses.json` to
`--out`. Every commit trains from the same images, with the same seed; each keeps its own config.yaml defaults.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from tests.helpers.archive_server import ArchiveServer
from tests.helpers.tiny_coco import make_archives, make_dataset

REPO = Path(__file__).resolve().parents[1]

# Run inside each commit's worktree, with that commit's helpers: writes its tiny config for the served archives.
WRITE_CONFIG = """
import json, sys
from pathlib import Path
try:
    from tests.helpers.workflow import tiny_config, write_config
except ImportError:
    from tests.workflow import tiny_config, write_config
workdir, url, archives, epochs = Path(sys.argv[1]), sys.argv[2], json.loads(sys.argv[3]), int(sys.argv[4])
write_config(workdir, tiny_config(workdir, url, archives, epochs=epochs, epochs_per_block=epochs))
"""


def per_step_losses(tree: Path, workdir: Path, url: str, archives: dict[str, dict], epochs: int) -> list[float]:
    """Train `epochs` epochs with the commit checked out in `tree`; its epoch log's losses, step by step."""
    workdir.mkdir(parents=True)
    served = {name: {**info, "path": str(info["path"])} for name, info in archives.items()}
    subprocess.run(
        [sys.executable, "-c", WRITE_CONFIG, str(workdir), url, json.dumps(served), str(epochs)], cwd=tree, check=True
    )
    target = "results/train/block_01/epochs.json"
    command = [sys.executable, "-m", "snakemake", "--snakefile", str(tree / "Snakefile"), "--directory", str(workdir)]
    command += ["--configfile", str(workdir / "config.yaml"), "--cores", "2", target]
    result = subprocess.run(command, cwd=tree, capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"{tree.name}: snakemake failed:\n{result.stdout[-4000:]}{result.stderr[-4000:]}")
    return [loss for epoch in json.loads((workdir / target).read_text()) for loss in epoch["loss"]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("revs", nargs="+", help="commits to compare (the first is the reference)")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--out", type=Path, help="folder for losses.json (default: a temporary folder)")
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="losses-"))
    out = args.out or scratch
    out.mkdir(parents=True, exist_ok=True)
    archives = make_archives(make_dataset(scratch / "tiny_coco"), scratch / "archives")
    losses: dict[str, list[float]] = {}
    with ArchiveServer(scratch / "archives") as server:
        for rev in args.revs:
            commit = subprocess.run(["git", "rev-parse", rev], cwd=REPO, capture_output=True, text=True, check=True)
            tree = scratch / f"tree-{commit.stdout.strip()[:10]}"
            subprocess.run(["git", "worktree", "add", "-q", "--detach", str(tree), rev], cwd=REPO, check=True)
            try:
                losses[rev] = per_step_losses(tree, scratch / f"run-{tree.name}", server.url, archives, args.epochs)
            finally:
                subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=REPO, check=False)
    (out / "losses.json").write_text(json.dumps(losses, indent=1))
    reference = args.revs[0]
    same = True
    for rev, values in losses.items():
        identical = values == losses[reference]
        same &= identical
        print(f"{rev}: {len(values)} steps, {'identical to' if identical else 'DIFFERENT from'} {reference}")
        print("  " + " ".join(f"{value:.6f}" for value in values))
    print(f"losses: {out / 'losses.json'}")
    sys.exit(0 if same else 1)


if __name__ == "__main__":
    main()
