"""``python -m scripts.caller COMMAND ...``: the caller-side commands (``--help`` lists them)."""

import sys

from scripts.commands import Command, run

COMMANDS = {
    "invoke": Command(
        "scripts.caller.invoke", "call each model of an endpoint with a file and print a readable result"
    ),
    "batch-local": Command(
        "scripts.caller.batch_local", "run a JSON Lines file through the local stack as a Batch Transform job does"
    ),
}

sys.exit(
    run("python -m scripts.caller", "Caller-side tools: call an endpoint, try a Batch Transform job locally.", COMMANDS)
)
