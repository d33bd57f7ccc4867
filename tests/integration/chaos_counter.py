#!/usr/bin/env python3
"""The chaos suite's counting compensator and reader: it appends one JSON line per execution —
``{"job", "pod", "role", "key", "at"}`` — to ``$REVERSI_CHAOS_EXEC_LOG`` (opened ``O_APPEND``,
written with one ``write``), then becomes ``demo/downstream/tool.py`` (``exec``), so the exit
code, output and termination message are the tool's own. ``POD_NAME`` and ``JOB_NAME`` come from
the downward API (the runner's env). The suite counts how often each Job's program really ran."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

TOOL = Path(__file__).resolve().parents[2] / "demo" / "downstream" / "tool.py"


def main() -> None:
    line = json.dumps({"job": os.environ.get("JOB_NAME"), "pod": os.environ.get("POD_NAME"),
                       "role": os.environ.get("REVERSI_ROLE"), "key": os.environ.get("REVERSI_IDEMPOTENCY_KEY"),
                       "at": time.time()}) + "\n"
    fd = os.open(os.environ["REVERSI_CHAOS_EXEC_LOG"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)
    os.execv(sys.executable, [sys.executable, str(TOOL)])


if __name__ == "__main__":
    main()
