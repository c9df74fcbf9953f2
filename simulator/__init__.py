"""A simulated vLLM endpoint: OpenAI API, vLLM-named ``/metrics``, an engine model.

The engine model (:mod:`servemon.simulator.engine`) does continuous batching with
chunked prefill over a paged KV cache with prefix caching
(:mod:`servemon.simulator.kvcache`), and steps in real time with a cost model
(:mod:`servemon.simulator.profiles`). The HTTP face is :mod:`servemon.simulator.server`;
the metric names per dialect are in :mod:`servemon.simulator.metrics`.
"""

from servemon.simulator.config import Faults, SimConfig
from servemon.simulator.engine import Engine
from servemon.simulator.profiles import Profile
from servemon.simulator.server import SimServer

__all__ = ["Engine", "Faults", "Profile", "SimConfig", "SimServer"]
