"""Schema-driven fuzzing of a live SQLite-backed server with every schemathesis check.

``st run`` (schemathesis' CLI) generates positive and negative requests from
``/openapi.json`` with a fixed seed and a fixed per-operation example budget,
and checks them all: no 5xx, every schema-valid request accepted, every
schema-violating one refused, every status and answer documented, ``Allow``
on 405s. The document is exact, not merely safe.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

from test_server_e2e import ServerProcess

EXAMPLES_PER_OPERATION = 10
SEED = 20_261_202


def test_fuzzing_with_every_check_finds_nothing(tmp_path: Path) -> None:
    server = ServerProcess(f"sqlite:{tmp_path / 'fuzz.db'}", token="fuzz-token")
    url = server.start()
    try:
        done = subprocess.run(
            [
                str(Path(sys.executable).with_name("st")),
                "run",
                f"{url}/openapi.json",
                "--header",
                "Authorization: Bearer fuzz-token",
                "--checks",
                "all",
                "--phases",
                "examples,fuzzing",
                "--mode",
                "all",
                "--max-examples",
                str(EXAMPLES_PER_OPERATION),
                "--seed",
                str(SEED),
                "--workers",
                "1",
                "--generation-database",
                "none",
                "--no-color",
                "--report",
                "ndjson",
                "--report-ndjson-path",
                str(tmp_path / "events.ndjson"),
            ],
            capture_output=True,
            text=True,
            timeout=240,
            cwd=tmp_path,
        )
    finally:
        server.stop()
    report = done.stdout + done.stderr
    assert done.returncode == 0, report[-4000:]
    generated = re.search(r"(\d+) generated", report)
    assert generated is not None, report[-2000:]
    # Every operation was exercised: 30 routes x a fixed budget (minus duplicates).
    assert int(generated.group(1)) >= 30 * 5, report[-2000:]
    routes = re.search(r"(\d+) selected / (\d+) total", report)
    assert routes is not None and f"{routes.group(2)} passed" in report, report[-2000:]
    # The token was accepted and requests reached the store (not only rejections).
    statuses = Counter(
        int(code)
        for code in re.findall(
            r'"status_code":\s*(\d+)', (tmp_path / "events.ndjson").read_text("utf-8")
        )
    )
    assert statuses[401] == 0, statuses
    assert statuses[200] + statuses[204] > 0, statuses
    assert not [code for code in statuses if code >= 500], statuses
