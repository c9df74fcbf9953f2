"""One run from many load machines: a coordinator that owns the run and workers that
send its requests (:mod:`.coordinator`, :mod:`.worker`, their messages in
:mod:`.wire`, the clocks between them in :mod:`.clock`)."""
