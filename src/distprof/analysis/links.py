"""Peak bandwidth of the links a collective can cross, per GPU and direction, in GB/s (1e9 bytes per second), the
unit nccl-tests' bus bandwidth is in: a collective's ``busbw`` (:mod:`.collectives`) is compared with these.

Vendors print NVLink as the total over both directions ("900 GB/s" for an H100 SXM); one direction is half of it,
which is what a ring or tree collective's bus bandwidth can reach (nccl-tests doc/PERFORMANCE.md: busbw is to be
compared with the hardware's peak, one direction). Network links are printed in Gb/s per port, per direction:
one NIC per GPU (DGX and HGX systems) makes that figure, over 8, the per-GPU bandwidth across nodes.

Which link a collective crosses is rarely in the trace: a process group's ranks may sit on one node or several.
:func:`reference` assumes **one node when the job has at most** :data:`GPUS_PER_NODE` **ranks** (the largest
NVLink domain of an HGX board), several otherwise; the finding says which it assumed.
"""

from __future__ import annotations

from dataclasses import dataclass

from distprof.analysis.peaks import normalise

__all__ = ["GPUS_PER_NODE", "LINKS", "Link", "reference"]

GPUS_PER_NODE = 8


@dataclass(frozen=True)
class Link:
    name: str
    gbps: float  # GB/s per GPU, one direction
    source: str


_NV = "https://www.nvidia.com/en-us/data-center/nvlink/"
LINKS: dict[str, Link] = {
    # NVLink per GPU, both directions as printed: V100 300, A100 600, H100/H200 900 GB/s (the datasheets and _NV)
    "nvlink2": Link("NVLink 2 (V100 SXM2)", 150.0,
                    "https://images.nvidia.com/content/technologies/volta/pdf/volta-v100-datasheet-update-us-1165301-r5.pdf"
                    " (300 GB/s both directions)"),
    "nvlink3": Link("NVLink 3 (A100 SXM)", 300.0,
                    "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/"
                    "nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf (600 GB/s both directions)"),
    "nvlink4": Link("NVLink 4 (H100/H200 SXM)", 450.0,
                    "https://www.nvidia.com/en-us/data-center/h100/ (900 GB/s both directions); " + _NV),
    # PCIe x16, one direction after 128b/130b encoding: 8, 16, 32 GT/s x 16 lanes (PCI-SIG base specifications 3-5)
    "pcie3": Link("PCIe gen3 x16", 15.75, "PCI-SIG PCIe 3.0 base specification: 8 GT/s per lane, 128b/130b"),
    "pcie4": Link("PCIe gen4 x16", 31.5, "PCI-SIG PCIe 4.0 base specification: 16 GT/s per lane, 128b/130b"),
    "pcie5": Link("PCIe gen5 x16", 63.0, "PCI-SIG PCIe 5.0 base specification: 32 GT/s per lane, 128b/130b"),
    # InfiniBand per port, one direction: EDR 100, HDR 200, NDR 400 Gb/s (ConnectX-5/6/7 product briefs)
    "ib_edr": Link("InfiniBand EDR (100 Gb/s per GPU)", 12.5,
                   "https://www.nvidia.com/en-us/networking/infiniband-adapters/ (ConnectX-5: EDR 100 Gb/s)"),
    "ib_hdr": Link("InfiniBand HDR (200 Gb/s per GPU)", 25.0,
                   "https://www.nvidia.com/en-us/networking/infiniband-adapters/ (ConnectX-6: HDR 200 Gb/s)"),
    "ib_ndr": Link("InfiniBand NDR (400 Gb/s per GPU)", 50.0,
                   "https://www.nvidia.com/en-us/networking/infiniband-adapters/ (ConnectX-7: NDR 400 Gb/s)"),
}

# deviceProperties name (normalised, substring) -> (link within a node, link across nodes); most specific first.
# PCIe and NVL parts: PCIe within a node (an NVL pair's bridge links two GPUs, not the group). AMD parts: no entry
# (Infinity Fabric topologies vary): no reference, no finding.
_BY_DEVICE: tuple[tuple[str, str, str], ...] = (
    ("h100 pcie", "pcie5", "ib_ndr"), ("h100 nvl", "pcie5", "ib_ndr"), ("h200 nvl", "pcie5", "ib_ndr"),
    ("h100", "nvlink4", "ib_ndr"), ("h200", "nvlink4", "ib_ndr"),
    ("a100 80gb pcie", "pcie4", "ib_hdr"), ("a100 pcie", "pcie4", "ib_hdr"), ("a100", "nvlink3", "ib_hdr"),
    ("v100 pcie", "pcie3", "ib_edr"), ("v100s", "pcie3", "ib_edr"), ("v100", "nvlink2", "ib_edr"),
)


def reference(device: str | None, world_size: int | None) -> tuple[Link, str] | None:
    """The link a collective of a job of ``world_size`` ranks on ``device`` (a deviceProperties name) is assumed to
    cross, and the assumption (``"one node"`` or ``"several nodes"``); None for a device not in the table."""
    if not device:
        return None
    norm = normalise(device)
    hit = next((x for x in _BY_DEVICE if x[0] in norm), None)
    if hit is None:
        return None
    one = world_size is not None and world_size <= GPUS_PER_NODE
    return (LINKS[hit[1]], "one node") if one else (LINKS[hit[2]], "several nodes")
