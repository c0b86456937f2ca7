"""scripts/caller/batch_local.py against a fake container in a thread that speaks the Batch Transform
protocol: GET /execution-parameters, and POST /invocations in application/jsonlines answered one
line per input line, a bad line refusing the whole request with its line number in the body."""

from __future__ import annotations

import io
import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from scripts.caller import batch_local
from scripts.caller.batch_local import MIB, Batch, Progress, read_lines, refusal, split_batches


class FakeContainer(ThreadingHTTPServer):
    """Echoes each envelope's payload as its result; a line whose modelname is "broken" (or that is
    not JSON) refuses the request. Records each body's size, the first record of each batch in the
    order answered, and the most requests in flight at once."""

    daemon_threads = True

    def __init__(self, concurrency: int = 4, max_mb: float = 1.0, delay=lambda first: 0.0, drop_a_line=False):
        super().__init__(("127.0.0.1", 0), Handler)
        self.concurrency, self.max_mb, self.delay, self.drop_a_line = concurrency, max_mb, delay, drop_a_line
        self.sizes: list[int] = []
        self.answered: list[int] = []
        self.in_flight = self.max_in_flight = 0
        self.lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: FakeContainer

    def log_message(self, *args) -> None:
        pass

    def reply(self, status: int, body: bytes, ctype: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        parameters = {
            "MaxConcurrentTransforms": self.server.concurrency,
            "BatchStrategy": "MULTI_RECORD",
            "MaxPayloadInMB": self.server.max_mb,
        }
        self.reply(200, json.dumps(parameters).encode())

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        fake = self.server
        with fake.lock:
            fake.sizes.append(len(body))
            fake.in_flight += 1
            fake.max_in_flight = max(fake.max_in_flight, fake.in_flight)
        try:
            time.sleep(fake.delay(json.loads(body.split(b"\n")[0])["payload"]["n"]))
            status, answer, ctype = self.answer(body)
            with fake.lock:
                fake.answered.append(json.loads(body.split(b"\n")[0])["payload"]["n"] if status == 200 else -1)
        finally:
            with fake.lock:
                fake.in_flight -= 1
        self.reply(status, answer, ctype)

    def answer(self, body: bytes) -> tuple[int, bytes, str]:
        fake = self.server
        assert self.headers["Content-Type"] == batch_local.JSONLINES
        if len(body) > fake.max_mb * MIB:
            error = {"code": "payload_too_large", "message": "too large"}
            return 413, json.dumps({"error": error}).encode(), "application/json"
        lines = read_lines(body)
        out = []
        for number, line in enumerate(lines, 1):
            try:
                envelope = json.loads(line)
            except ValueError:
                envelope = {"modelname": "broken"}
            if envelope["modelname"] == "broken":
                error = {
                    "code": "invalid_input",
                    "message": f"line {number}: modelname broken is refused",
                    "line": number,
                }
                return 400, json.dumps({"error": error}).encode(), "application/json"
            out.append(json.dumps({"modelname": envelope["modelname"], "version": "1", "result": envelope["payload"]}))
        if fake.drop_a_line:
            out.pop()
        return 200, "".join(line + "\n" for line in out).encode(), batch_local.JSONLINES


@pytest.fixture
def container():
    made: list[FakeContainer] = []

    def start(**kwargs) -> FakeContainer:
        server = FakeContainer(**kwargs)
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        made.append(server)
        return server

    yield start
    for server in made:
        server.shutdown()
        server.server_close()


def envelopes(count: int, pad: int = 40) -> list[dict]:
    """Records of varied sizes, each numbered."""
    return [{"modelname": "resnet", "payload": {"n": n, "text": "x" * (pad + (n * 37) % 90)}} for n in range(count)]


def write_jsonl(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def run(capsys, *argv) -> tuple[int, str, str]:
    status = batch_local.main([str(a) for a in argv])
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def test_read_lines_takes_an_optional_final_newline():
    assert read_lines(b"a\nb\n") == read_lines(b"a\nb") == [b"a", b"b"]
    assert read_lines(b"a\n\nb\n") == [b"a", b"", b"b"]  # a blank line stays, for the container to refuse


def test_batches_are_consecutive_full_and_within_the_limit():
    lines = [json.dumps(r).encode() for r in envelopes(50)]
    limit = 700
    batches = split_batches(lines, limit)
    assert len(batches) > 5
    assert [line for b in batches for line in b.lines] == lines
    assert [b.start for b in batches] == [1 + sum(len(x.lines) for x in batches[:i]) for i in range(len(batches))]
    sizes = [sum(len(line) + 1 for line in batch.lines) for batch in batches]  # each line ends in "\n"
    assert max(sizes) <= limit
    for size, following in zip(sizes, batches[1:]):
        assert size + len(following.lines[0]) + 1 > limit  # the next line would not have fitted


def test_an_oversize_line_is_refused_with_its_file_line_before_anything_is_sent(container, tmp_path, capsys):
    records = envelopes(10)
    records[4]["payload"]["text"] = "y" * 5000
    fake = container()
    out = tmp_path / "out.jsonl"
    status, _, err = run(
        capsys,
        write_jsonl(tmp_path / "in.jsonl", records),
        out,
        "--endpoint-url",
        fake.url,
        "--max-payload-mb",
        2000 / MIB,
        "--concurrency",
        2,
    )
    assert status == 1
    size = len(json.dumps(records[4])) + 1
    assert f"batch_local: line 5 is {size} bytes with its newline, over the payload limit of 2000 bytes" in err
    assert fake.sizes == []
    assert not out.exists()


def test_output_is_in_input_order_with_requests_answered_out_of_order(container, tmp_path, capsys):
    records = envelopes(80)

    def delay(first: int) -> float:
        """The first batch is answered only after another one (timed delays alone let a busy machine
        answer in order): then the rest at staggered delays."""
        if first == 0:
            waited = time.monotonic() + 10
            while not fake.answered and time.monotonic() < waited:
                time.sleep(0.01)
            return 0.0
        return 0.06 * ((first * 7) % 3) / 2

    fake = container(delay=delay)
    out = tmp_path / "out.jsonl"
    status, stdout, err = run(
        capsys,
        write_jsonl(tmp_path / "in.jsonl", records),
        out,
        "--endpoint-url",
        fake.url,
        "--max-payload-mb",
        900 / MIB,
        "--concurrency",
        4,
    )
    assert status == 0, err
    assert len(fake.sizes) > 8 and max(fake.sizes) <= 900
    assert fake.answered != sorted(fake.answered)  # the container did answer out of order
    answers = [json.loads(line) for line in out.read_text().splitlines()]
    assert answers == [{"modelname": "resnet", "version": "1", "result": r["payload"]} for r in records]
    assert f"80 lines, {len(fake.sizes)} batches" in stdout and "lines/s" in stdout


def test_concurrency_never_exceeds_the_flag(container, tmp_path, capsys):
    fake = container(concurrency=16, delay=lambda first: 0.05)
    status, _, err = run(
        capsys,
        write_jsonl(tmp_path / "in.jsonl", envelopes(60)),
        tmp_path / "out.jsonl",
        "--endpoint-url",
        fake.url,
        "--max-payload-mb",
        600 / MIB,
        "--concurrency",
        3,
    )
    assert status == 0, err
    assert len(fake.sizes) >= 9
    assert 2 <= fake.max_in_flight <= 3


def test_without_flags_the_containers_execution_parameters_rule(container, tmp_path, capsys):
    fake = container(concurrency=2, max_mb=800 / MIB, delay=lambda first: 0.05)
    status, stdout, err = run(
        capsys, write_jsonl(tmp_path / "in.jsonl", envelopes(60)), tmp_path / "out.jsonl", "--endpoint-url", fake.url
    )
    assert status == 0, err
    assert len(fake.sizes) > 4 and max(fake.sizes) <= 800
    assert 1 <= fake.max_in_flight <= 2
    assert "concurrency 2" in stdout


def test_a_refused_batch_names_the_files_line_and_leaves_no_output(container, tmp_path, capsys):
    records = envelopes(200)
    records[136]["modelname"] = "broken"
    fake = container()
    out = tmp_path / "out.jsonl"
    status, stdout, err = run(
        capsys,
        write_jsonl(tmp_path / "in.jsonl", records),
        out,
        "--endpoint-url",
        fake.url,
        "--max-payload-mb",
        1500 / MIB,
        "--concurrency",
        3,
    )
    assert status == 1
    assert "batch_local: line 137: modelname broken is refused (400 invalid_input)" in err
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl"]
    assert stdout == ""


def test_an_answer_short_of_a_line_is_an_error(container, tmp_path, capsys):
    fake = container(drop_a_line=True)
    out = tmp_path / "out.jsonl"
    status, _, err = run(capsys, write_jsonl(tmp_path / "in.jsonl", envelopes(5)), out, "--endpoint-url", fake.url)
    assert status == 1
    assert "lines 1-5: the answer has 4 lines for 5 sent" in err
    assert not out.exists()


def test_a_refusal_without_a_line_names_the_batch():
    batch = Batch(start=101, lines=(b"{}",) * 50)
    body = json.dumps({"error": {"code": "payload_too_large", "message": "body over 6291456 bytes"}}).encode()
    assert refusal(batch, 413, body) == "lines 101-150: body over 6291456 bytes (413 payload_too_large)"
    line_body = json.dumps({"error": {"code": "unknown_model", "message": "line 3: no model x", "line": 3}}).encode()
    assert refusal(batch, 404, line_body) == "line 103: no model x (404 unknown_model)"
    assert refusal(batch, 502, b"<html>bad gateway</html>").startswith("lines 101-150: refused with status 502")


def test_progress_is_shown_on_stderr(container, tmp_path, capsys):
    fake = container()
    status, _, err = run(
        capsys,
        write_jsonl(tmp_path / "in.jsonl", envelopes(30)),
        tmp_path / "out.jsonl",
        "--endpoint-url",
        fake.url,
        "--max-payload-mb",
        500 / MIB,
    )
    assert status == 0, err
    assert f"30/30 lines, {len(fake.sizes)}/{len(fake.sizes)} batches" in err and "lines/s" in err


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_redraws_in_place_on_a_terminal_and_prints_lines_elsewhere():
    terminal = Terminal()
    bar = Progress(lines=10, batches=2, stream=terminal)
    bar.update(5, 1)
    bar.update(10, 2, final=True)
    assert terminal.getvalue().count("\r") == 2 and terminal.getvalue().endswith("\n")
    assert "[############............] 5/10 lines, 1/2 batches" in terminal.getvalue()
    log = io.StringIO()
    bar = Progress(lines=10, batches=2, stream=log, every=3600)
    bar.update(5, 1)  # within `every` of the start: nothing yet
    bar.update(10, 2, final=True)
    assert "\r" not in log.getvalue() and log.getvalue().count("\n") == 1 and "10/10 lines" in log.getvalue()


def test_connection_refused_says_the_stack_is_not_running(tmp_path, capsys):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}"
    out = tmp_path / "out.jsonl"
    status, _, err = run(capsys, write_jsonl(tmp_path / "in.jsonl", envelopes(3)), out, "--endpoint-url", url)
    assert status == 1
    assert f"no stack answers on {url}" in err and "make run" in err
    assert not out.exists()


def test_a_write_that_fails_midway_leaves_neither_the_file_nor_a_temporary(tmp_path):
    def parts():
        yield b'{"result": 1}\n'
        raise OSError("No space left on device")

    out = tmp_path / "out.jsonl"
    with pytest.raises(OSError):
        batch_local.write_atomically(out, parts())
    assert list(tmp_path.iterdir()) == []
    batch_local.write_atomically(out, [b"a\n", b"b\n"])
    assert out.read_bytes() == b"a\nb\n" and list(tmp_path.iterdir()) == [out]


def test_every_refused_batch_is_reported_in_the_files_order(container, tmp_path, capsys):
    records = envelopes(60)
    for number in (52, 9):
        records[number - 1]["modelname"] = "broken"
    fake = container(delay=lambda first: 0.2)  # every batch is in flight before the first answer
    status, _, err = run(
        capsys,
        write_jsonl(tmp_path / "in.jsonl", records),
        tmp_path / "out.jsonl",
        "--endpoint-url",
        fake.url,
        "--max-payload-mb",
        600 / MIB,
        "--concurrency",
        16,
    )
    assert status == 1
    reported = [line for line in err.splitlines() if line.startswith("batch_local: line ")]
    assert reported == [f"batch_local: line {n}: modelname broken is refused (400 invalid_input)" for n in (9, 52)]


def test_after_a_refusal_no_further_batch_is_sent(container, tmp_path, capsys):
    records = envelopes(60)
    records[2]["modelname"] = "broken"  # in the first batch
    fake = container()
    status, _, err = run(
        capsys,
        write_jsonl(tmp_path / "in.jsonl", records),
        tmp_path / "out.jsonl",
        "--endpoint-url",
        fake.url,
        "--max-payload-mb",
        600 / MIB,
        "--concurrency",
        1,
    )
    assert status == 1 and "batch_local: line 3: modelname broken is refused" in err
    assert len(fake.sizes) == 1  # one at a time: the batches after the refused one never left
