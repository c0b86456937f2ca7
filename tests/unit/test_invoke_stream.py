"""invoke --stream: boto3's invoke_endpoint_with_response_stream reads the event stream the local
stack writes (``app.router.event_stream``) with its own parser, PayloadParts cut anywhere (inside an
event, inside a UTF-8 character) are joined before an event is read, each token is printed as it
arrives, and an error event or a ModelStreamError ends the call with exit status 1."""

from __future__ import annotations

import io
import json

import pytest
from botocore.awsrequest import AWSResponse
from urllib3.response import HTTPResponse

from app.router.event_stream import EVENT_STREAM_TYPE, model_stream_error, payload_parts
from scripts.caller import invoke
from scripts.events import DONE, StreamFailed, event_text, sse_events

PIECES = ["Le", " café", " 日本", " 🙂", "."]


def tgi_events(pieces: list[str]) -> list[bytes]:
    events = [
        {"token": {"id": i, "text": piece, "logprob": -0.5, "special": False}, "generated_text": None, "details": None}
        for i, piece in enumerate(pieces)
    ]
    events[-1]["generated_text"] = "".join(pieces)
    return [b"data: " + json.dumps(event, ensure_ascii=False).encode() + b"\n\n" for event in events]


def chat_events(pieces: list[str]) -> list[bytes]:
    chunks = [{"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": p}}]} for p in pieces]
    return [b"data: " + json.dumps(c, ensure_ascii=False).encode() + b"\n\n" for c in chunks] + [b"data: [DONE]\n\n"]


@pytest.mark.parametrize("cut", [1, 2, 3, 7, 1000])
def test_events_are_read_whole_however_the_bytes_are_cut(cut):
    raw = b"".join(tgi_events(PIECES))
    parts = [raw[i : i + cut] for i in range(0, len(raw), cut)]
    events = list(sse_events(parts))
    assert [event_text(e) for e in events] == PIECES
    assert events[-1]["generated_text"] == "".join(PIECES)


def test_chat_chunks_end_with_done():
    events = list(sse_events(chat_events(PIECES)))
    assert events[-1] == DONE
    assert "".join(event_text(e) for e in events) == "".join(PIECES)


def test_an_error_event_or_a_cut_event_fails():
    with pytest.raises(StreamFailed, match="validation: bad"):
        [event_text(e) for e in sse_events([b'data: {"error": "bad", "error_type": "validation"}\n\n'])]
    with pytest.raises(StreamFailed, match="inside an event"):
        list(sse_events([b'data: {"token": ']))


def local_stack(chunks: list[bytes], seen: list, status: int = 200):
    """What the local stack answers boto3's InvokeEndpointWithResponseStream, in place of the network."""

    def answer(request, **_):
        seen.append(request)
        if status != 200:
            raw = json.dumps({"error": "invalid_input", "message": "payload.max_new_tokens: too many"}).encode()
            headers = {"Content-Type": "application/json"}
        else:
            raw = b"".join(chunks)
            headers = {"Content-Type": EVENT_STREAM_TYPE, "X-Amzn-SageMaker-Content-Type": "text/event-stream"}
        return AWSResponse(request.url, status, headers, HTTPResponse(body=io.BytesIO(raw), preload_content=False))

    client = invoke.make_client(None, "http://localhost:8080")
    client.meta.events.register("before-send.sagemaker-runtime.InvokeEndpointWithResponseStream", answer)
    return client


@pytest.fixture
def prompt(tmp_path):
    path = tmp_path / "prompt.txt"
    path.write_text("Tell me about coffee")
    return path


def test_tokens_are_printed_as_they_come_through_boto3s_own_parser(prompt, capsys):
    seen: list = []
    client = local_stack(list(payload_parts(tgi_events(PIECES), part_bytes=3)), seen)
    argv = ["--endpoint-url", "http://localhost:8080", "--stream", "--option", "max_new_tokens=5", f"chat={prompt}"]
    assert invoke.main(argv, client=client) == 0
    out = capsys.readouterr().out
    assert "Le café 日本 🙂." in out
    assert "5 events" in out
    (request,) = seen
    assert request.url == "http://localhost:8080/endpoints/local/invocations-response-stream"
    assert json.loads(request.body) == {
        "modelname": "chat",
        "payload": {"text": "Tell me about coffee", "max_new_tokens": 5, "stream": True},
    }


def test_a_model_stream_error_fails_the_call(prompt, capsys):
    chunks = [*payload_parts(tgi_events(PIECES[:2])), model_stream_error("ModelError", "Triton went away")]
    client = local_stack(chunks, [])
    assert invoke.main(["--endpoint-url", "http://localhost:8080", "--stream", f"chat={prompt}"], client=client) == 1
    out = capsys.readouterr().out
    assert "Le café" in out
    assert "Triton went away" in out


def test_an_error_before_the_stream_is_the_containers_json(prompt, capsys):
    client = local_stack([], [], status=400)
    assert invoke.main(["--endpoint-url", "http://localhost:8080", "--stream", f"chat={prompt}"], client=client) == 1
    assert "payload.max_new_tokens: too many" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--stream", "--async", "s3://bucket/in/"], "does not go with --async"),
        (["--stream"], "needs MODEL=FILE pairs"),
    ],
)
def test_what_stream_refuses(capsys, argv, message):
    with pytest.raises(SystemExit):
        invoke.main(["--endpoint-name", "mm", *argv], client=local_stack([], []))
    assert message in capsys.readouterr().err
