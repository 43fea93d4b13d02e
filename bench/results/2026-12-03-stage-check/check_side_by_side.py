"""The staged copy's reuse check (`scripts.stage.manifest_of`) before and after, alternating, on one tree.

usage: python bench/results/2026-12-03-stage-check/check_side_by_side.py TREE BEFORE_CHECKOUT [ROUNDS]
TREE: a dataset folder; BEFORE_CHECKOUT: a checkout of the commit before (git worktree add DIR 40c98ac).
Prints each round's seconds, the medians, their ratio and both fingerprints (they must be equal).
"""

import importlib.util
import json
import statistics
import sys
import time
from pathlib import Path

tree, before_root = Path(sys.argv[1]), Path(sys.argv[2])
rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 5


def load(root: Path, name: str):
    sys.path.insert(0, str(root))
    spec = importlib.util.spec_from_file_location(name, root / "scripts" / "stage.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    sys.path.pop(0)
    return module


before = load(before_root, "stage_before")
after = load(Path(__file__).resolve().parents[3], "stage_after")
times = {"before": [], "after": []}
fingerprints = {}
for _ in range(rounds):
    for name, module in (("before", before), ("after", after)):
        started = time.perf_counter()
        manifest, _files = module.manifest_of(tree, 8)
        times[name].append(round(time.perf_counter() - started, 3))
        fingerprints[name] = manifest.fingerprint
medians = {name: statistics.median(values) for name, values in times.items()}
print(
    json.dumps(
        {
            "files": manifest.files,
            "seconds": times,
            "median_seconds": medians,
            "ratio": round(medians["before"] / medians["after"], 2),
            "fingerprints": fingerprints,
        },
        indent=1,
    )
)
