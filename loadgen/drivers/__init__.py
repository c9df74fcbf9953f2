"""Drivers: one async function per kind of run over the run's context -- the open
loop (ramp), the closed loop (sweep), the capacity search, replay, and the load
controller (``control/``, with its law and the client-side models it steers on).
What several drivers share is not a driver: the open loop's sending
(``openloop``) and conversations (``conversation``).
"""
