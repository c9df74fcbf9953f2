"""The foundation, the ground floor every part stands on: the exception tree
(:mod:`errors`), validated config fields (:mod:`fields`), and the vocabulary every
part speaks -- the published series (:mod:`names`), how a request ends
(:mod:`outcomes`), histogram edges, SLO terms, PromQL, the signals a run steers by,
the generated series reference -- with the wire formats one floor up in
:mod:`servemon.core.wire`. Nothing here imports any other part of servemon.
"""
