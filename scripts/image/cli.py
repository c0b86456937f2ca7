"""``python -m scripts.image build``: the serving image (``--flavor cpu`` by default: the one a
machine without a GPU can build and run), its build time, size and five largest layers.
``python -m scripts.image run``: that image run as SageMaker runs it, in the foreground; SIGTERM,
SIGHUP and Ctrl-C stop it as SageMaker does (SIGTERM, 30 s) and remove it, so its port is free again."""

from __future__ import annotations

import argparse
import contextlib
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from scripts.image.engine import (
    EngineError,
    build_args,
    can_publish,
    ensure_base,
    find_engine,
    layers,
    run_args,
    settle_podman,
    show,
    stop_container,
)

DEFAULT_TAG = "multi-model:cpu"
STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)  # a supervisor or `timeout`, a closed terminal, Ctrl-C
STOP_GRACE_S = 30  # SageMaker's: SIGTERM, then SIGKILL 30 s later


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m scripts.image", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    build = sub.add_parser("build", help="build the image and print its time, size and largest layers")
    build.add_argument("--flavor", choices=("cpu", "gpu"), default="cpu", help="the Dockerfile's FLAVOR")
    build.add_argument("--tag", default=DEFAULT_TAG)
    build.add_argument("--base", help="the CPU image's base (default: Debian 12, pulled or made with debootstrap)")
    build.add_argument(
        "--generation", action="store_true", help="with torch and transformers, for text2text models (a larger image)"
    )
    run = sub.add_parser("run", help="run the image as SageMaker does, in the foreground")
    run.add_argument("--tag", default=DEFAULT_TAG)
    run.add_argument("--repository", type=Path, default=Path("models"), help="mounted read-only at /opt/ml/model")
    run.add_argument("--port", type=int, default=8080, help="the host's port for the container's 8080")
    return p.parse_args(argv)


def build(args: argparse.Namespace) -> int:
    engine = find_engine()
    base = ensure_base(engine, args.base) if args.flavor == "cpu" else None
    if base:
        settle_podman(engine, base)
    argv = ["build", *build_args(engine, args.flavor, base, args.tag, args.generation)]
    show(engine.argv(*argv))
    began = time.monotonic()
    engine.run(*argv)
    took = time.monotonic() - began
    size = int(engine.run("image", "inspect", "--format", "{{.Size}}", args.tag, quiet=True).stdout.strip() or 0)
    print(f"\nbuilt {args.tag} with {engine.name} in {took:.1f} s: {size / 1e6:,.0f} MB; its five largest layers:")
    for layer_size, step in layers(engine, args.tag)[:5]:
        print(f"  {layer_size / 1e6:10,.1f} MB  {step[:110]}")
    return 0


def run(args: argparse.Namespace) -> int:
    engine = find_engine()
    settle_podman(engine, args.tag)
    publish = can_publish(engine, args.tag)
    name = f"multi-model-{args.port}"
    argv = run_args(args.repository, args.port, args.tag, publish=publish, extra=["--rm", "--name", name])
    if not publish:
        print(f"{engine.name} cannot publish ports here: the container uses the host's network", flush=True)
    show(engine.argv(*argv))
    # Its own session: a signal meant for us (Ctrl-C's, a closed terminal's, `timeout`'s to the whole
    # group) never reaches the client, which would pass it on to `serve`; the container is stopped below.
    client = subprocess.Popen(engine.argv(*argv), **engine.process_options(), start_new_session=True)
    with stop_signals():
        try:
            return client.wait()
        except Stopped as stopped:
            with contextlib.suppress(OSError):  # a closed terminal (SIGHUP) cannot be written to: stop anyway
                print(f"stopping container {name} ({stopped}), up to {STOP_GRACE_S} s", file=sys.stderr, flush=True)
            stop_container(engine, name, client, grace_s=STOP_GRACE_S)
            return 128 + stopped.signum


class Stopped(Exception):
    """A stop signal, raised where ``run`` waits for its container; ``str()`` is its name."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@contextlib.contextmanager
def stop_signals() -> Iterator[None]:
    """Within the block the first of STOP_SIGNALS raises ``Stopped`` and later ones are swallowed, so
    that nothing cuts the container's stop short; the previous handlers come back on the way out.
    A signal already ignored (``nohup``, SIGINT in a background job) stays ignored."""

    def swallow(signum: int, frame: object) -> None:
        pass

    def first(signum: int, frame: object) -> None:
        for number in caught:
            signal.signal(number, swallow)
        raise Stopped(signum)

    previous = {number: signal.getsignal(number) for number in STOP_SIGNALS}
    caught = [number for number, handler in previous.items() if handler is not signal.SIG_IGN]
    for number in caught:
        signal.signal(number, first)
    try:
        yield
    finally:
        for number in caught:
            signal.signal(number, previous[number])


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        return build(args) if args.command == "build" else run(args)
    except EngineError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
