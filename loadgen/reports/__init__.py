"""Reports: ``report.html`` and its plots, runs compared side by side, and shards
merged into one run. The top wing below :mod:`servemon.loadgen.runner`.
"""
