"""``servemon control``: a feedback loop that holds a server-side signal at a
setpoint for a soak. The driver (:mod:`~servemon.loadgen.drivers.control.driver`),
its law (:mod:`~servemon.loadgen.drivers.control.law`), what it measures each tick
(:mod:`~servemon.loadgen.drivers.control.signal`) and the client-side models it
steers on: the prefill backlog and pace
(:mod:`~servemon.loadgen.drivers.control.backlog`) and the tokens held in flight
(:mod:`~servemon.loadgen.drivers.control.held`).
"""

from servemon.loadgen.drivers.control.driver import drive_control

__all__ = ["drive_control"]
