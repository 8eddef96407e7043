"""Choosing the GPU source: NVML where the driver answers, else the labelled simulation."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Protocol

import pynvml

from services.telemetry.config import ENV_PREFIX, SourceKind, TelemetrySettings
from services.telemetry.nvml_source import NvmlSource
from services.telemetry.sample import GpuReading
from services.telemetry.simulated_source import SimulatedSource

logger = logging.getLogger(__name__)


class GpuSource(Protocol):
    def read(self) -> list[GpuReading]:
        """One reading per GPU. May block (NVML): call it from a thread, not the event loop."""
        ...

    def close(self) -> None:
        """Release the source; safe to call twice."""
        ...


class SourceUnavailableError(RuntimeError):
    """The configured source cannot run here (NVML was required and the driver did not answer)."""


def open_source(settings: TelemetrySettings, load: Callable[[], float]) -> GpuSource:
    """The source settings.source asks for. load: busy fraction in [0, 1], used only when simulated.

    "auto" falls back to SimulatedSource with one warning when NVML fails; "nvml" raises
    SourceUnavailableError instead. Blocks while NVML initialises.
    """
    if settings.source is not SourceKind.SIMULATED:
        try:
            return NvmlSource(settings.gpu_index)
        except pynvml.NVMLError as err:
            if settings.source is SourceKind.NVML:
                raise SourceUnavailableError(
                    f"{ENV_PREFIX}SOURCE=nvml but NVML is unavailable ({err}); install the NVIDIA driver, "
                    f"or set {ENV_PREFIX}SOURCE=auto or simulated to run the simulated thermal source"
                ) from err
            logger.warning(
                "no NVML (%s): running the SIMULATED thermal source; samples are labelled simulated", err
            )
    indices = None if settings.gpu_index is None else [settings.gpu_index]
    return SimulatedSource(settings.sim, load, gpu_indices=indices)
