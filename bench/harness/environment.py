"""What a result records about the machine (device, driver, torch, CUDA, flashinfer) and the result's file name."""

from __future__ import annotations

import datetime
import importlib.metadata
import platform
import re
import subprocess
from typing import Any


def _driver_version() -> str | None:
    try:
        output = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return output.strip().splitlines()[0] if output.strip() else None


def _distribution_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def describe_machine(today: datetime.date | None = None) -> dict[str, Any]:
    """Device name, driver, torch, CUDA, flashinfer and peer versions, host and date (None where absent)."""
    import torch

    cuda = torch.cuda.is_available()
    return {
        "date": (today or datetime.date.today()).isoformat(),
        "device": torch.cuda.get_device_name(0) if cuda else "cpu",
        "driver": _driver_version() if cuda else None,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "flashinfer": _distribution_version("flashinfer-python"),
        "breakable_cuda_graphs": _distribution_version("breakable-cuda-graphs"),
        "piecewise_cuda_graphs": _distribution_version("piecewise-cuda-graphs"),
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpu_count": _cpu_count(),
    }


def _cpu_count() -> int:
    import os

    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def device_slug(device: str) -> str:
    """A short file-name form of a device name: ``NVIDIA H100 80GB HBM3`` -> ``h100``, else the name lowercased."""
    match = re.search(r"\b([A-Z]\d{2,4}[A-Za-z]?)\b", device)
    if match:
        return match.group(1).lower()
    return re.sub(r"[^a-z0-9]+", "-", device.lower()).strip("-") or "device"


def result_stem(environment: dict[str, Any], quick: bool) -> str:
    """``DATE-DEVICE-bench[-quick]``: the name (without suffix) of a run's JSON file and plots."""
    return f"{environment['date']}-{device_slug(str(environment['device']))}-bench{'-quick' if quick else ''}"
