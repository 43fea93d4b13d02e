#!/usr/bin/env bash
# docs/fp8.md's FP8 install command (rfdetr_coco_pipeline.training.fp8.INSTALL), run unchanged on a GPU machine without network:
# pip resolves the project and its fp8 extra offline, from files that travel in chunks small enough for one call.
#
#   bench/fp8_offline.sh pack DEST WHEELS  here, with the package index: Transformer Engine's parts
#                                          (../shared/gpu/transformer_engine.sh pack) and the wheels of everything
#                                          else the fp8 extra needs that the wheelhouse WHEELS lacks, tarred and
#                                          split into DEST/c0, DEST/c1, ... of 55 MiB each: carry one per call.
#   bench/fp8_offline.sh receive DIR       there, in each call: copy the carried chunk to /tmp/fp8-chunks.
#   bench/fp8_offline.sh install WHEELS    there, after the last chunk: unpack, reassemble the Transformer Engine
#                                          core wheel, then run FP8_INSTALL in the checkout with PIP_NO_INDEX=1 and
#                                          PIP_FIND_LINKS naming the unpacked files and the folder WHEELS (the
#                                          project's wheelhouse, ../shared/gpu/wheelhouse.sh).
#
# Which wheels: pip's own resolution of the project's dependencies plus the fp8 extra for Python 3.12 on x86-64
# (`pip install --dry-run --report`), less the large packages a CUDA image already carries (torch, its CUDA
# libraries, numpy, ...: SKIP below). Where the image's version of a package conflicts (snakemake needs
# packaging<26), pip takes the wheel from here instead. Calls must follow each other within the machine's idle
# release (about 30 s), or /tmp is lost.
set -euo pipefail
V=2.20.2
CORE=transformer_engine_cu13-$V-py3-none-manylinux_2_28_x86_64.whl
SKIP='^(torch|torchvision|triton|nvidia-(cublas|cuda|cudnn-cu|cufft|cufile|curand|cusolver|cusparse|nccl|nvjitlink|nvshmem|nvtx)|cuda-|numpy|scipy|pandas|matplotlib|pyarrow|transformers|pillow|grpcio|sympy|tensorboard|fonttools|opencv|transformer.engine)'
here=$(cd "$(dirname "$0")/.." && pwd)
case ${1:-} in
  pack)
    dest=$(realpath -m "${2:?DEST}"); wheels=$(realpath "${3:?WHEELS: the wheelhouse folder}")
    tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
    plat=(--only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64
          --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64
          --platform manylinux2014_x86_64 --platform any)
    "$here/../shared/gpu/transformer_engine.sh" pack "$tmp/te" >/dev/null
    mkdir -p "$tmp/files" && mv "$tmp"/te/te*/* "$tmp/files/"
    # the torch extension's sdist cannot be resolved for another platform: its own requirements (PKG-INFO) stand in
    # for it, beside the project's dependencies, the Transformer Engine wheels and FP8_INSTALL's build tools
    python3 - "$here/pyproject.toml" "$tmp/files/transformer_engine_torch-$V.tar.gz" "$V" > "$tmp/requirements.txt" <<'EOF'
import email, sys, tarfile, tomllib
pyproject, sdist, version = sys.argv[1:]
with tarfile.open(sdist) as archive:
    info = archive.extractfile(f"transformer_engine_torch-{version}/PKG-INFO").read().decode()
requirements = tomllib.load(open(pyproject, "rb"))["project"]["dependencies"]
requirements += email.message_from_string(info).get_all("Requires-Dist")
requirements += [f"transformer-engine=={version}", "setuptools", "wheel", "ninja"]
print("\n".join(requirements))
EOF
    python3 -m pip install -q --dry-run --ignore-installed --report "$tmp/report.json" --target "$tmp/none" \
      "${plat[@]}" --find-links "$tmp/files" --find-links "$wheels" -r "$tmp/requirements.txt"
    python3 -c "
import json, re, sys
for item in json.load(open('$tmp/report.json'))['install']:
    name, version = item['metadata']['name'], item['metadata']['version']
    if not re.match(sys.argv[1], name.lower().replace('_', '-')):
        print(f'{name}=={version}')" "$SKIP" > "$tmp/wheels.txt"
    python3 -m pip download -q --no-deps "${plat[@]}" --find-links "$tmp/files" --find-links "$wheels" -d "$tmp/files" \
      -r "$tmp/wheels.txt"
    for w in "$wheels"/*; do rm -f "$tmp/files/$(basename "$w")"; done  # these travel in the wheelhouse
    rm -rf "$dest"; mkdir -p "$dest"
    tar cf - -C "$tmp/files" . | split -b 55m -d -a 2 - "$tmp/chunk."
    i=0; for c in "$tmp"/chunk.*; do mkdir -p "$dest/c$i"; mv "$c" "$dest/c$i/"; i=$((i + 1)); done
    echo "$(wc -l < "$tmp/wheels.txt") wheels beside Transformer Engine's parts, in $i chunks:"; du -sh "$dest"/c* ;;
  receive)
    mkdir -p /tmp/fp8-chunks && cp "${2:?DIR}"/chunk.* /tmp/fp8-chunks/ && ls /tmp/fp8-chunks | wc -l ;;
  install)
    wheels=$(realpath "${2:?WHEELS: the wheelhouse folder}"); files=/tmp/fp8-files
    rm -rf "$files" && mkdir -p "$files" && cat /tmp/fp8-chunks/chunk.* | tar xf - -C "$files"
    cat "$files"/part.[0-4] > "$files/$CORE" && (cd "$files" && md5sum -c core.md5) && rm "$files"/part.[0-4]
    # read as text: importing the package needs the packages this command is about to install
    command=$(cd "$here" && python3 -c 'import ast; print(next(n.value.value for n in ast.parse(open("src/rfdetr_coco_pipeline/training/fp8.py").read()).body if isinstance(n, ast.Assign) and n.targets[0].id == "INSTALL"))')
    # the command's `pip` must be the pip of the Python that holds torch (in a user's venv it is; on the CUDA image
    # /usr/local/bin/pip belongs to another interpreter), so a shim ahead on PATH runs `python3 -m pip`
    mkdir -p /tmp/fp8-pip && printf '#!/bin/sh\nexec %s -m pip "$@"\n' "$(python3 -c 'import sys; print(sys.executable)')" > /tmp/fp8-pip/pip
    chmod +x /tmp/fp8-pip/pip && export PATH=/tmp/fp8-pip:$PATH
    echo "$ $command   (PIP_NO_INDEX=1, PIP_FIND_LINKS=$files $wheels; pip is $(command -v pip): $(pip --version))"
    cd "$here" && time PIP_NO_INDEX=1 PIP_FIND_LINKS="$files $wheels" bash -c "$command"
    python3 -c "import transformer_engine.pytorch as te, importlib.metadata as m; print('transformer_engine', m.version('transformer_engine'), 'imports')" ;;
  *) sed -n 2,20p "$0"; exit 2 ;;
esac
