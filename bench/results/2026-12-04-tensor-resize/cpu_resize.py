"""One resize at COCO's image sizes: Pillow's against torch's uint8 kernel (channels last), and how far apart their
pixels are. The CPU figures of NOTES.md.

usage: python bench/results/2026-12-04-tensor-resize/cpu_resize.py DIR   (DIR: synth_coco.py --detail coco)
"""

import glob
import sys
import time

import numpy as np
import simplejpeg
import torch
import torchvision.transforms.v2.functional as F
from PIL import Image
from torchvision import tv_tensors

torch.set_num_threads(1)
files = sorted(glob.glob(f"{sys.argv[1]}/train2017/*.jpg"))[:40]
decoded = [simplejpeg.decode_jpeg(open(path, "rb").read()) for path in files]
seconds, differences = [0.0, 0.0], []
for pixels in decoded:
    for size in ([384, 384], [450, 600], [401, 533]):
        started = time.perf_counter()
        by_pillow = F.resize(Image.fromarray(pixels), size, antialias=True)
        middle = time.perf_counter()
        by_torch = F.resize(tv_tensors.Image(torch.from_numpy(pixels.copy()).permute(2, 0, 1)), size, antialias=True)
        seconds[0] += middle - started
        seconds[1] += time.perf_counter() - middle
        apart = (torch.from_numpy(np.array(by_pillow)).permute(2, 0, 1).int() - by_torch.int()).abs()
        differences.append((apart.max().item(), (apart > 0).float().mean().item()))
resizes = len(differences)
print(f"Pillow {seconds[0] / resizes * 1000:.2f} ms, torch {seconds[1] / resizes * 1000:.2f} ms a resize")
largest, share = max(d[0] for d in differences), max(d[1] for d in differences)
print(f"largest difference {largest} levels; pixels that differ, at most {share:.2f}")
