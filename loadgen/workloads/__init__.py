"""Workloads: the ``--workload`` spec language and every kind of prompt source --
synthetic, files, sessions, traces -- with token counting and the model mix.
Beside :mod:`servemon.loadgen.send`, on the lowest floor of the load generator.
"""
