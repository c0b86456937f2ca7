"""scripts/caller/batch_local.py against the real stack: a 300-line JSON Lines file mixing the three
models comes back as 300 lines, each what a single application/json call of that line answers; a
broken line 137 stops the job with that line number, and no output file.

The lines repeat 24 distinct envelopes (each model, single items and lists, with and without
options), so that one single call per envelope gives what each of its lines must answer; the
models slow on a CPU (bert_base ~0.45 s a text here, yolov5 ~0.33 s an image, resnet ~0.13) are one
line in six each, mostly single items. Batches are kept to a few lines each, so that no request
comes near the 60 s MODEL_SERVER_TIMEOUT on a small machine."""

from __future__ import annotations

import base64
import io
import json
from pathlib import Path

import pytest
import requests
from PIL import Image

from scripts.caller import batch_local
from tests.references import real_photos

pytestmark = pytest.mark.integration

LINES = 300
BROKEN = 137
BATCHES = 40  # about 8 lines a batch
OPTIONS = {"resnet": {"topk": 2}, "yolov5": {"conf_threshold": 0.4}, "bert_base": {"topk": 2}}
TEXTS = (
    "The capital of France is [MASK].",
    "The world has [MASK] people.",
    "She poured the [MASK] into a cup and drank it.",
    "A [MASK] is chasing the [MASK] across the field.",
    "He played the [MASK] at the concert last night.",
)


def shrunk(photo: bytes) -> str:
    """The photo at most 160 pixels wide and high, in its own format, as base64: a small file."""
    image = Image.open(io.BytesIO(photo))
    kind = image.format
    image.thumbnail((160, 160))
    buffer = io.BytesIO()
    image.save(buffer, format=kind)
    return base64.b64encode(buffer.getvalue()).decode()


def envelopes() -> list[dict]:
    """The distinct envelopes the file is made of: each model, single items and lists of 2,
    with and without options."""
    small = [shrunk(photo) for photo in real_photos().values()]
    made = []
    for n in range(24):
        model = ("resnet", "bert_base", "resnet", "yolov5", "resnet", "resnet")[n % 6]
        count = (1, 2, 1, 1)[n % 4]
        if model == "bert_base":
            texts = [TEXTS[(n + i) % len(TEXTS)] for i in range(2 if n == 1 else 1)]  # one list of two
            payload = {"text": texts[0] if len(texts) == 1 else texts}
        else:
            images = [small[(n + i) % len(small)] for i in range(1 if model == "yolov5" else count)]
            payload = {"img": images[0] if len(images) == 1 else images}
        if n % 5 == 0:
            payload.update(OPTIONS[model])
        made.append({"modelname": model, "payload": payload})
    return made


@pytest.fixture(scope="module")
def records() -> list[dict]:
    """300 lines drawn from the distinct envelopes in a scrambled order (the models take turns
    irregularly); a single call per distinct envelope is then what every line of it must equal."""
    pool = envelopes()
    return [pool[(n * 7 + n // len(pool)) % len(pool)] for n in range(LINES)]


def write_jsonl(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines))
    return path


def limit_mb(lines: list[str], batches: int) -> float:
    """A payload limit that cuts the file into about ``batches`` batches, and holds its largest line."""
    sizes = [len(line.encode()) + 1 for line in lines]
    return max(max(sizes), sum(sizes) // batches) / batch_local.MIB


def run(capsys, *argv) -> tuple[int, str, str]:
    status = batch_local.main([str(a) for a in argv])
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def test_every_line_answers_what_a_single_call_answers(stack, records, tmp_path, capsys):
    lines = [json.dumps(r) for r in records]
    out = tmp_path / "out.jsonl"
    status, stdout, err = run(
        capsys,
        write_jsonl(tmp_path / "in.jsonl", lines),
        out,
        "--endpoint-url",
        stack.url,
        "--max-payload-mb",
        limit_mb(lines, BATCHES),
        "--concurrency",
        4,
    )
    assert status == 0, err
    batches = int(stdout.split(" lines, ")[1].split(" batches")[0])
    assert batches >= BATCHES // 2, stdout
    answered = out.read_text().splitlines()
    assert len(answered) == LINES
    singles: dict[str, dict] = {}  # one single call per distinct envelope
    with requests.Session() as session:
        for number, (line, answer) in enumerate(zip(lines, answered), 1):
            if line not in singles:
                single = session.post(
                    f"{stack.url}/invocations", data=line, timeout=120, headers={"Content-Type": "application/json"}
                )
                assert single.status_code == 200, (number, single.text[:300])
                singles[line] = single.json()
            assert json.loads(answer) == singles[line], f"line {number}"
    assert len(singles) == len({json.dumps(e) for e in envelopes()})
    assert {r["modelname"] for r in records} == {"resnet", "yolov5", "bert_base"}
    assert f"{LINES}/{LINES} lines" in err


def test_a_broken_line_137_is_reported_and_nothing_is_written(stack, records, tmp_path, capsys):
    """Batches sent one at a time; the first holds line 137, so the job stops with it (the unit tests
    translate a later batch's line numbers). The broken line is resnet's, the model of the batch's
    first line, whose lines the router runs first: the refusal comes before the other models run."""
    lines = [json.dumps(r) for r in records]
    assert records[0]["modelname"] == "resnet"
    lines[BROKEN - 1] = json.dumps({"modelname": "resnet", "payload": {"img": base64.b64encode(b"no image").decode()}})
    out = tmp_path / "out.jsonl"
    status, stdout, err = run(
        capsys,
        write_jsonl(tmp_path / "in.jsonl", lines),
        out,
        "--endpoint-url",
        stack.url,
        "--max-payload-mb",
        limit_mb(lines, 2),
        "--concurrency",
        1,
    )
    assert status == 1
    refusals = [line for line in err.splitlines() if line.startswith("batch_local: line ")]
    assert len(refusals) == 1, err
    assert refusals[0].startswith(f"batch_local: line {BROKEN}: payload.img is not a decodable image"), err
    assert refusals[0].endswith("(400 invalid_input)"), err
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl"]
    assert stdout == ""
