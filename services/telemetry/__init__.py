"""Per-node GPU telemetry agent: NVML samples (or a labelled thermal simulation) streamed to the placer."""
