"""The exporter: engine ``/metrics`` fetched and normalized to servemon's schema,
NVML GPU stats, the canary probe, and the exporter's own config and HTTP server. The
vocabulary it publishes lives in :mod:`servemon.core`, shared with every part."""
