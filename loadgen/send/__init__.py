"""Sending, the load generator's lowest wing: one timed request (:mod:`client`,
:mod:`timing`), the seeded schedule (:mod:`arrivals`), the open-loop dispatcher
(:mod:`dispatch`), the closed loop, how a run stops, what a request costs the
client, and the CPU wake-up bound.
"""
