"""What servemon's HTTP clients and servers share on the wire: SSE framing and when an
answer is complete (:mod:`sse`), POSTs resent after a closed pooled connection
(:mod:`http`), what one answer may cost (:mod:`limits`), how a request went wrong
(:mod:`failures`), and the ``--web-config-file`` of both ``/metrics`` servers
(:mod:`webconfig`). Imports only the vocabulary below it.
"""
