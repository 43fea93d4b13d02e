"""`python -m rfdetr_coco_pipeline.hooks`: the speedups and the always-on hooks as docs/speedups.md's tables.

`--sources`: the source digests of every hook's targets in the installed packages (torch's own functions aside), as
`checked_sources.py` records them; run it after checking the hooks against a new rfdetr or Lightning release, and
paste what it prints there.
"""

import argparse

from rfdetr_coco_pipeline.hooks import all_targets, hooks_table, markdown_table, resolve, source_digest

parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
parser.add_argument("--sources", action="store_true", help="print the installed targets' source digests")
if parser.parse_args().sources:
    print("CHECKED: dict[str, tuple[str, ...]] = {")
    for path in all_targets():
        target = resolve(path)
        function = getattr(target, "fget", None) or getattr(target, "__func__", None) or target
        # torch's own functions differ between the torch builds the workflow runs on: their existence is checked
        if getattr(function, "__module__", "torch").split(".")[0] != "torch" and (digest := source_digest(target)):
            print(f'    "{path}": ("{digest}",),')
    print("}")
else:
    print(markdown_table(), hooks_table(), sep="\n\n")
