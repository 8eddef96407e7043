"""NVML clock-event (throttle) reason bits and GPU temperature thresholds, as the placer reads them.

Bit values are those of nvidia-ml-py's pynvml (`nvmlClocksEventReason*`), copied so the placer does not
import the NVML bindings.
"""

from __future__ import annotations

import numpy as np

GPU_IDLE = 0x1
APPLICATIONS_CLOCKS_SETTING = 0x2
SW_POWER_CAP = 0x4
HW_SLOWDOWN = 0x8  # hardware slowdown: thermal or power brake, the driver does not say which
SYNC_BOOST = 0x10
SW_THERMAL_SLOWDOWN = 0x20
HW_THERMAL_SLOWDOWN = 0x40
HW_POWER_BRAKE_SLOWDOWN = 0x80
DISPLAY_CLOCK_SETTING = 0x100

# Clocks cut because the GPU is hot. HW_SLOWDOWN is counted here: it is mostly thermal in practice.
THERMAL_SLOWDOWN = SW_THERMAL_SLOWDOWN | HW_THERMAL_SLOWDOWN | HW_SLOWDOWN
# Clocks cut to stay under the power limit (or by an external power brake).
POWER_SLOWDOWN = SW_POWER_CAP | HW_POWER_BRAKE_SLOWDOWN
# Hardware-enforced thermal throttling: the filter treats it as critical once past the slowdown threshold.
HW_THERMAL = HW_THERMAL_SLOWDOWN | HW_SLOWDOWN

# Slowdown threshold assumed when NVML does not report one (0 in the sample). 87 C is the lowest
# NVML_TEMPERATURE_THRESHOLD_SLOWDOWN among common data-center parts (V100 87 C, A100/H100 about 89-90 C),
# so guessing it errs on the cautious side.
DEFAULT_SLOWDOWN_TEMPERATURE_C = 87.0


_AS_UINT64: dict[int, np.uint64] = {}  # masks converted once: np.uint64() is a call per use otherwise


def any_bits(reasons: np.ndarray, mask: int) -> np.ndarray:
    """Per row: True where reasons (uint64 clock-event bit mask) has any bit of mask set."""
    wide = _AS_UINT64.get(mask)
    if wide is None:
        wide = _AS_UINT64[mask] = np.uint64(mask)
    return (reasons & wide) != 0


def slowdown_threshold_c(
    reported_c: np.ndarray, default_c: float = DEFAULT_SLOWDOWN_TEMPERATURE_C
) -> np.ndarray:
    """Slowdown threshold per row in degrees C: the reported one, or default_c where it is 0 (unknown)."""
    return np.where(reported_c > 0.0, reported_c, default_c)
