"""A stack that failed to start shows its log's end with repeated lines counted, so that the router's
pings while Triton loads do not push out what Triton said before it ended."""

from __future__ import annotations

import json

from scripts.devtools import Stack


def test_a_repeated_message_is_shown_once_with_its_count(tmp_path):
    log = tmp_path / "serve.log"
    pings = [json.dumps({"time": f"12:00:{i:02}", "message": "ping: Triton cannot be reached"}) for i in range(200)]
    log.write_text("\n".join(["Signal (11) received.", *pings, json.dumps({"message": "triton exited"})]) + "\n")
    stack = Stack(tmp_path)
    stack.log_path = log

    assert stack.log_tail(lines=5).splitlines() == [
        "Signal (11) received.",
        pings[0],
        "... the line above 199 more times",
        json.dumps({"message": "triton exited"}),
    ]
