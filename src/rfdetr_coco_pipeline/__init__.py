"""RF-DETR Nano trained from scratch on COCO2017, as a Snakemake workflow: the code its stages share.

`settings` (the validated config), `blocks`, `needs` (what a run needs from the machine), `data` (download,
extract, verify, RAM-disk staging), `training` (the route, rfdetr's call, resuming, the compile warm-up), `hooks`
(the one registry of hooks into rfdetr's and Lightning's private code, the speedups among them, and their gate),
`evaluation`, `export` and `plotting`. The stage entry points in scripts/ call them; nothing here runs on its own.
"""
