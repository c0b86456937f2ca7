"""Where a model's weights come from: pretrained (downloaded), a user's file, or seeded random (the
model's own architecture, or, for tests, a small network of its family: ``small``)."""

from __future__ import annotations

import hashlib
import socket
import sys
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

PRETRAINED, RANDOM, FILE, SMALL = "pretrained", "random", "file", "small"
PROBE_TIMEOUT_S = 3.0


@dataclass(frozen=True)
class WeightsChoice:
    """What the user asked for and what is used; ``reason`` says why they differ."""

    source: str  # pretrained | random | file | small
    seed: int
    path: Path | None = None
    reason: str = ""
    variant: str = ""  # what else the export depends on (a text model's config): part of the cache key

    @property
    def cache_key(self) -> str:
        if self.source in (RANDOM, SMALL):
            key = f"{self.source}-seed{self.seed}"
        elif self.source == FILE:
            key = f"file-{fingerprint(self.path)[:16]}"
        else:
            key = PRETRAINED
        return f"{key}-{self.variant}" if self.variant else key

    def describe(self) -> str:
        if self.source == RANDOM:
            return f"random weights, seed {self.seed}"
        if self.source == SMALL:
            return f"a small network of the family, random weights, seed {self.seed}"
        if self.source == FILE:
            return f"weights from {self.path}"
        return "pretrained weights"


def probe(url: str, timeout: float = PROBE_TIMEOUT_S) -> str | None:
    """None when the host of ``url`` accepts a TCP connection within ``timeout``; else why not."""
    parsed = urlparse(url)
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    try:
        with socket.create_connection((parsed.hostname, port), timeout=timeout):
            return None
    except OSError as error:
        return f"{parsed.hostname} is not reachable ({error.__class__.__name__}: {error})"


def fingerprint(path: Path) -> str:
    """sha256 over a file, or over every file of a directory (names and contents, sorted)."""
    digest = hashlib.sha256()
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    for file in files:
        digest.update(str(file.relative_to(path) if path.is_dir() else file.name).encode())
        with file.open("rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()


def warn_fallback(model: str, reason: str, seed: int) -> None:
    """The loud banner shown when pretrained weights are replaced by random ones."""
    bar = "!" * 78
    lines = [
        bar,
        f"WARNING: [{model}] PRETRAINED WEIGHTS ARE NOT AVAILABLE: {reason}",
        f"WARNING: [{model}] USING RANDOM WEIGHTS (seed {seed}). Its outputs are MEANINGLESS.",
        f"WARNING: [{model}] recorded as weights_source=random in source.json and config.pbtxt.",
        bar,
    ]
    print("\n".join(lines), file=sys.stderr, flush=True)
