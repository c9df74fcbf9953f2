"""``--workers N``: the workers get the run's headers from a private file, never on
their command lines (which every user of the machine can read)."""

from __future__ import annotations

import stat
from pathlib import Path

from servemon.loadgen.run.config import LoadConfig
from servemon.workers import _header_file, _worker_config


def test_workers_get_headers_from_a_private_file_that_is_removed(
    tmp_path: Path,
) -> None:
    own = tmp_path / "headers"
    own.write_text("X-Auth-Token: file-SECRET\n")
    config = LoadConfig(header=("X-Api-Key: flag-SECRET",), header_file=str(own))
    shared = _worker_config(config, "http://127.0.0.1:8000")
    assert "header" not in shared
    assert "header_file" not in shared
    assert "SECRET" not in str(shared)
    with _header_file(config) as argv:
        assert argv[0] == "--header-file"
        assert "SECRET" not in " ".join(argv)
        path = Path(argv[1])
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert path.read_text().splitlines() == [
            "X-Auth-Token: file-SECRET",
            "X-Api-Key: flag-SECRET",
        ]
        assert not path.is_relative_to(Path(config.out).resolve())
    assert not path.exists()
    with _header_file(LoadConfig()) as argv:
        assert argv == []
