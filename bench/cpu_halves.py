"""Two equal, disjoint sets of this machine's CPUs, one per GPU, for running two trainings side by side.

usage: python -m bench.cpu_halves        prints two `taskset -c` lists on one line: "0-7,16-23 8-15,24-31"

Side by side on one host, the stock recipe's 16 loader workers and the train stage's 16 would otherwise share
every core, and whichever process asks harder takes cores from the other: the stage's workers, which run at a
lower priority by design, lose them to the stock recipe's. Each process gets half the cores instead, as a machine
with one H200 and 16 cores (the device machine's single-GPU kind) would give it. Both hyperthreads of a core go to
the same half, and when the machine has two NUMA nodes each half is one node.
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

from rfdetr_coco_pipeline.common import run_stage

SYSFS = Path("/sys/devices/system")


class Cpu(NamedTuple):
    number: int
    node: int
    package: int
    core: int


def split_cpus(cpus: list[Cpu]) -> tuple[list[int], list[int]]:
    """Two halves of `cpus` with whole cores in each, by NUMA node when there are exactly two of equal size."""
    nodes = sorted({cpu.node for cpu in cpus})
    if len(nodes) == 2:
        halves = [[cpu.number for cpu in cpus if cpu.node == node] for node in nodes]
        if len(halves[0]) == len(halves[1]):
            return sorted(halves[0]), sorted(halves[1])
    cores = sorted({(cpu.node, cpu.package, cpu.core) for cpu in cpus})
    first = set(cores[: len(cores) // 2])
    return (
        sorted(cpu.number for cpu in cpus if (cpu.node, cpu.package, cpu.core) in first),
        sorted(cpu.number for cpu in cpus if (cpu.node, cpu.package, cpu.core) not in first),
    )


def as_taskset_list(numbers: list[int]) -> str:
    """[0, 1, 2, 5, 6] -> "0-2,5-6"."""
    ranges: list[list[int]] = []
    for number in sorted(numbers):
        if ranges and number == ranges[-1][1] + 1:
            ranges[-1][1] = number
        else:
            ranges.append([number, number])
    return ",".join(f"{a}-{b}" if a != b else str(a) for a, b in ranges)


def this_machine(sysfs: Path = SYSFS) -> list[Cpu]:
    node_of = {}
    for node in sysfs.glob("node/node[0-9]*"):
        for cpu_dir in node.glob("cpu[0-9]*"):
            node_of[int(cpu_dir.name[3:])] = int(node.name[4:])
    cpus = []
    for topology in sorted(sysfs.glob("cpu/cpu[0-9]*/topology")):
        number = int(topology.parent.name[3:])
        package, core = (int((topology / name).read_text()) for name in ("physical_package_id", "core_id"))
        cpus.append(Cpu(number, node_of.get(number, 0), package, core))
    return cpus


def main() -> None:
    first, second = split_cpus(this_machine())
    print(as_taskset_list(first), as_taskset_list(second))


if __name__ == "__main__":
    run_stage(main)
