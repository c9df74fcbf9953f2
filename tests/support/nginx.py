"""Debian's nginx in end-to-end tests: in the foreground, everything it writes
(config, pid, logs, temp files) in the test's folder, balancing its upstreams by
weighted least_conn with ``proxy_buffering off`` for SSE."""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from pathlib import Path

__all__ = ["NGINX", "nginx_argv", "nginx_file"]

NGINX = shutil.which("nginx") or next(
    (p for p in ("/usr/sbin/nginx",) if Path(p).exists()), None
)


def nginx_file(folder: Path, listen: str, upstreams: Sequence[tuple[str, int]]) -> Path:
    """nginx in the foreground on ``listen`` (host:port), everything it writes
    under ``folder``, balancing ``upstreams`` (host:port, weight) by weighted
    least_conn, with SSE passed through unbuffered. Written again with other
    upstreams, a SIGHUP to nginx's master process loads them (its old workers
    finish the requests they hold)."""
    servers = "\n".join(
        f"        server {hostport} weight={weight} max_fails=1 fail_timeout=5s;"
        for hostport, weight in upstreams
    )
    temp = "\n".join(
        f"    {kind}_temp_path {folder / kind};"
        for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
    )
    text = f"""daemon off;
worker_processes 1;
pid {folder / "nginx.pid"};
error_log {folder / "error.log"} warn;
events {{
    worker_connections 1024;
}}
http {{
    access_log off;
{temp}
    upstream fleet {{
        least_conn;
{servers}
        keepalive 32;
    }}
    server {{
        listen {listen};
        location / {{
            proxy_pass http://fleet;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
            proxy_connect_timeout 1s;
            proxy_read_timeout 60s;
        }}
    }}
}}
"""
    path = folder / "nginx.conf"
    path.write_text(text, encoding="utf-8")
    return path


def nginx_argv(folder: Path, conf: Path) -> list[str]:
    """The command line that runs nginx on ``conf`` with ``folder`` as its prefix."""
    assert NGINX is not None
    return [NGINX, "-p", str(folder), "-c", str(conf), "-e", str(folder / "error.log")]
