"""Drivers: one async function per kind of run over the run's context -- the open
loop (ramp), the closed loop (sweep), the capacity search, replay, and the load
controller with its laws and the client-side models they steer on.
"""
