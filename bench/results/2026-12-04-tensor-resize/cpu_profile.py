"""Where one training image's loader time goes, in one process (cProfile): the CPU figures of NOTES.md.

usage: PYTHONPATH=. python bench/results/2026-12-04-tensor-resize/cpu_profile.py DIR
       (DIR: a set from synth_coco.py --detail coco)
"""

import cProfile
import pstats
import sys

from rfdetr_extensions.patches.images_as_bytes import images_as_bytes

from bench.loader import recipe_data

with images_as_bytes():
    samples = recipe_data(sys.argv[1], 1, 0).train_dataloader().dataset
    for index in range(10):
        samples[index]
    profile = cProfile.Profile()
    profile.enable()
    for index in range(10, 290):
        samples[index]
    profile.disable()
pstats.Stats(profile).sort_stats("cumulative").print_stats(45)
