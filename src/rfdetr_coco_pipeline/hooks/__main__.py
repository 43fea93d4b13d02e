"""`python -m rfdetr_coco_pipeline.hooks`: the speedups as docs/speedups.md's table.

`--sources`: the source digests of every hook's targets in the installed packages, as `checked_sources.py` records
them; run it after checking the hooks against a new rfdetr or Lightning release, and paste what it prints there.
"""

import argparse

from rfdetr_coco_pipeline.hooks import all_targets, markdown_table, resolve, source_digest

parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
parser.add_argument("--sources", action="store_true", help="print the installed targets' source digests")
if parser.parse_args().sources:
    print("CHECKED: dict[str, tuple[str, ...]] = {")
    for path in all_targets():
        target = resolve(path)
        function = getattr(target, "fget", None) or getattr(target, "__func__", None) or target
        ours = getattr(function, "__module__", "").startswith(("rfdetr", "pytorch_lightning", "lightning_fabric"))
        if ours and (digest := source_digest(target)) is not None:
            print(f'    "{path}": ("{digest}",),')
    print("}")
else:
    print(markdown_table())
