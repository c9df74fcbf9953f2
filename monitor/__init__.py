"""The exporter: engine ``/metrics`` normalized to servemon's schema, NVML GPU stats,
and a canary probe. (Arrives with the exporter issue.)"""
