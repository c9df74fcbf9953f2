"""The run's machinery: the typed config, the plan, the target found out before a
run, the one context a driver gets, live metrics, the samplers of the target's
signals, the guard rail, the client watch and the progress display.
"""
