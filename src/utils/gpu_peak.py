"""Dense bf16 tensor-core peaks of the GPUs a run may meet: the denominator of model FLOPs utilisation (MFU).

Figures are NVIDIA's datasheet numbers without structured sparsity (the datasheets print twice these "with
sparsity"), in FLOP/s. A device is found by its CUDA name (`torch.cuda.get_device_name`), matched against the
patterns below in order, first match wins; a name none matches (an H100 NVL, a consumer card, anything newer)
gets no peak (None) and so no MFU, instead of a guess.

    NVIDIA H100 80GB HBM3    -> H100 SXM    989.4 TFLOP/s
    NVIDIA H100 PCIe         -> H100 PCIe   756
    NVIDIA GH200 480GB       -> GH200       989.4 (the H100 SXM's chip)
    NVIDIA H200              -> H200 SXM    989.4 (the H100 SXM's chip, more memory)
    NVIDIA A100-SXM4-80GB    -> A100        312 (SXM and PCIe alike)
    NVIDIA L40S              -> L40S        362
    NVIDIA L4                -> L4          121
"""
from __future__ import annotations

import re
from dataclasses import dataclass

TERA = 1e12
# (label, pattern of the CUDA device name, dense bf16 FLOP/s); first match wins, so the specific names come first
PEAKS: tuple[tuple[str, str, float], ...] = (
    ("H100 PCIe", r"\bH100\b.*\bPCIe\b", 756 * TERA),
    ("H100 SXM", r"\bH100\b.*\b(SXM|HBM3)\b", 989.4 * TERA),
    ("GH200", r"\bGH200\b", 989.4 * TERA),
    ("H200 SXM", r"\bH200\b(?!.*\bNVL\b)", 989.4 * TERA),
    ("A100", r"\bA100\b", 312 * TERA),
    ("L40S", r"\bL40S\b", 362 * TERA),
    ("L4", r"\bL4\b", 121 * TERA),
)


@dataclass(frozen=True)
class Peak:
    label: str  # the table's name of the GPU (H100 SXM)
    flops: float  # dense bf16 FLOP/s


def peak_bf16(device_name: str) -> Peak | None:
    """The dense bf16 peak of the GPU called `device_name`; None where the table does not know it."""
    for label, pattern, flops in PEAKS:
        if re.search(pattern, device_name, flags=re.IGNORECASE):
            return Peak(label, flops)
    return None
