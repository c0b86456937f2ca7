"""Call each model of an endpoint with a file and print a readable result.

Each MODEL=FILE pair sends the file's bytes as the raw body (image/jpeg, image/png, or text for a
.txt file), the model named in the custom attributes, exactly as boto3's sagemaker-runtime does
for any caller. Without pairs: resnet and yolov5 get --image, bert_base gets --text.

    python -m scripts.caller invoke --endpoint-name multi-model resnet=dog.jpg yolov5=dog.jpg \\
        bert_base=sentence.txt
    python -m scripts.caller invoke --endpoint-url http://localhost:8080 --image build/samples/dog.jpg
    python -m scripts.caller invoke --endpoint-url http://localhost:8080 --option conf_threshold=0.5 yolov5=dog.jpg
    python -m scripts.caller invoke --endpoint-url http://localhost:8080 --draw out.png yolov5=dog.jpg
    python -m scripts.caller invoke --endpoint-url http://localhost:8080 --draw masks.png \\
        --option "boxes=100 50 420 500;450 80 700 560" sam=dog.jpg
    python -m scripts.caller invoke --endpoint-url http://localhost:8080 --draw found.png \\
        --option "labels=a dog;a bicycle" owlv2=dog.jpg

--draw PATH writes each image model's answer drawn on its image (scripts/caller/drawing.py): a
detector's boxes with labels and scores (a zero-shot detector's: its labels as --option labels=, phrases
separated by semicolons), a classifier's top-k, a segmenter's masks (translucent, one
colour a prompt; its prompts as --option boxes=, points=, point_labels=: numbers separated by spaces,
prompts by semicolons); with several image calls, one file
each, named PATH with the model's name added (out-resnet.png, out-yolov5.png).

--async s3://BUCKET/PREFIX/ calls an asynchronous endpoint (python -m scripts.sagemaker deploy
--async): each body is uploaded under that prefix, queued with InvokeEndpointAsync, and the answer
SageMaker writes to S3 is waited for (progress on stderr) and printed as a real-time answer is; a
failure object is printed, and the exit status is then 1.

    python -m scripts.caller invoke --endpoint-name mm-async --async s3://BUCKET/inputs/ yolov5=dog.jpg \\
        --draw out.png
    python -m scripts.caller invoke --endpoint-name mm-async --async s3://BUCKET/inputs/ \\
        --invocation-timeout 1800 --wait-timeout 3600 bert_base=sentence.txt

--tools FILE.json asks each text_generation MODEL=FILE's text as an OpenAI chat body with the file's
tools (OpenAI's function definitions) and prints the answer's text and the calls the model made
(scripts/caller/invoke_chat.py):

    python -m scripts.caller invoke --endpoint-url http://localhost:8080 --tools tools.json \
        --option max_tokens=64 qwen=question.txt

--target-model NAME.tar.gz calls that model of a multi-model endpoint (python -m scripts.sagemaker
deploy --multi-model; TargetModel, the X-Amzn-SageMaker-Target-Model header), --inference-component
NAME that component of an endpoint of inference components (python -m scripts.sagemaker deploy
--inference-components; InferenceComponentName). Every MODEL=FILE pair goes to it.
InvokeEndpointAsync takes neither, so neither goes with --async.

    python -m scripts.caller invoke --endpoint-name mm-mme --target-model resnet.tar.gz resnet=dog.jpg
    python -m scripts.caller invoke --endpoint-name mm-ic --inference-component mm-ic-yolov5 yolov5=dog.jpg

With --endpoint-url (the local stack) dummy credentials are used. A model's error is printed as the
container's JSON error, and the exit status is then 1.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from scripts.caller import invoke_async
from scripts.caller.errors import error_lines, failure_lines, keep_error_bodies
from scripts.caller.invoke_args import IMAGE_MODELS, TEXT_MODELS, add_arguments, check_arguments, route
from scripts.caller.invoke_chat import chat_body, chat_lines, read_json, read_tools, schema_body
from scripts.caller.invoke_stream import invoke_streamed

CONTENT_TYPES = {".jpg": "image/jpeg", ".jpeg": "image/jpeg", ".png": "image/png", ".txt": "text/plain; charset=utf-8"}


def make_client(region: str | None, endpoint_url: str | None):
    import boto3

    if endpoint_url:  # the local stack: any credentials and region do
        return boto3.client(
            "sagemaker-runtime",
            endpoint_url=endpoint_url,
            region_name=region or "us-east-1",
            aws_access_key_id="local",
            aws_secret_access_key="local",
        )
    return boto3.client("sagemaker-runtime", region_name=region)


def content_type(path: Path) -> str:
    return CONTENT_TYPES.get(path.suffix.lower(), "application/octet-stream")


def _score(value: Any) -> str:
    return f"{value:.3f}" if isinstance(value, (int, float)) else str(value)


def _index(entry: dict) -> str:
    return f" (index {entry['index']})" if "index" in entry else ""


def _detections(found: list, indent: str) -> list[str]:
    """The best ten boxes, a line each: label, score, box."""
    return [
        f"{indent}  {d.get('label')} {_score(d.get('score'))} [{', '.join(f'{v:.0f}' for v in d.get('box', []))}]"
        for d in found[:10]
    ]


def format_result(result: Any, indent: str = "  ") -> list[str]:
    """Readable lines for the shapes the models answer; JSON for anything else."""
    if isinstance(result, dict) and "detections" in result:
        lines = [f"{indent}{len(result['detections'])} detections in {result.get('width')}x{result.get('height')}"]
        return lines + _detections(result["detections"], indent)
    if isinstance(result, dict) and "generated_text" in result:  # text2text generation: the text, line by line
        return [indent + line for line in str(result["generated_text"]).splitlines()] or [f"{indent}''"]
    if isinstance(result, list) and result and all(isinstance(r, dict) for r in result):
        if "generated_text" in result[0]:  # text2text generation of a list of texts, numbered
            return [
                line for n, r in enumerate(result, 1) for line in (f"{indent}[{n}]", *format_result(r, indent + "  "))
            ]
        if "token_str" in result[0]:  # one mask of fill-mask
            return [f"{indent}{r['token_str']!r} {_score(r['score'])}  {r.get('sequence', '')}" for r in result]
        if "box" in result[0] and "label" in result[0]:  # a zero-shot detector's boxes, best first
            return [f"{indent}{len(result)} detections", *_detections(result, indent)]
        if "mask" in result[0]:  # a segmenter's masks, one a prompt (scripts/caller/drawing.py draws them)
            return [
                f"{indent}[{n}] score {_score(r['score'])} box {r['box']} "
                f"({r['mask']['size'][1]}x{r['mask']['size'][0]} RLE, {len(r['mask']['counts'])} characters)"
                for n, r in enumerate(result, 1)
            ]
        if "label" in result[0]:  # a classification
            return [f"{indent}{r['label']}{_index(r)} {_score(r['score'])}" for r in result]
        if "entity" in result[0] or "entity_group" in result[0]:  # token classification's entities
            return [
                f"{indent}{r.get('entity_group', r.get('entity'))} {_score(r['score'])} "
                f"{r.get('word')!r} [{r.get('start')}:{r.get('end')}]"
                for r in result
            ]
    if isinstance(result, list) and len(result) > 8 and all(isinstance(v, float) for v in result):  # an embedding
        norm = sum(v * v for v in result) ** 0.5
        head = ", ".join(f"{v:.4f}" for v in result[:4])
        return [f"{indent}{len(result)}-dimensional vector [{head}, ...] (L2 norm {norm:.4f})"]
    if isinstance(result, list) and result and all(isinstance(r, list) for r in result):
        lines = []
        for number, item in enumerate(result, 1):  # several masks, or a list of inputs
            lines.append(f"{indent}[{number}]")
            lines += format_result(item, indent + "  ")
        return lines
    return [indent + line for line in json.dumps(result, indent=2).splitlines()]


def custom_attributes(model: str, options: Sequence[str] = ()) -> str:
    return ",".join([f"modelname={model}", *options])


def invoke(
    client,
    endpoint_name: str,
    model: str,
    body: bytes,
    ctype: str,
    options: Sequence[str] = (),
    route: Mapping[str, str] | None = None,
) -> tuple[bool, list[str], Any]:
    """(ok, lines to print, the model's result or None); ``route`` adds TargetModel or InferenceComponentName."""
    from botocore.exceptions import ClientError

    attributes = custom_attributes(model, options)
    keep_error_bodies(client, "InvokeEndpoint")
    try:
        response = client.invoke_endpoint(
            EndpointName=endpoint_name,
            ContentType=ctype,
            Accept="application/json",
            Body=body,
            CustomAttributes=attributes,
            **(route or {}),
        )
    except ClientError as e:
        return False, error_lines(model, e), None
    return answer_lines(model, response["Body"].read())


def answer_lines(model: str, raw: bytes) -> tuple[bool, list[str], Any]:
    """A successful answer's (True, lines to print, the model's result or None)."""
    try:
        answer = json.loads(raw)
    except ValueError:
        return True, [f"{model}:", f"  {raw[:500].decode(errors='replace')}"], None
    if isinstance(answer, dict) and "result" in answer:
        return True, [f"{model} (version {answer.get('version')}):", *format_result(answer["result"])], answer["result"]
    return True, [f"{model}:", *format_result(answer)], answer


def invoke_queued(
    runtime, s3, args: argparse.Namespace, model: str, body: bytes, ctype: str
) -> tuple[bool, list[str], Any]:
    """The asynchronous call (--async): upload, InvokeEndpointAsync, wait for the answer in S3."""
    from botocore.exceptions import ClientError

    suffix = next((ext for ext, known in CONTENT_TYPES.items() if known == ctype), ".bin")
    location = invoke_async.input_location(args.async_prefix, model, suffix)
    try:
        queued = invoke_async.submit(
            runtime,
            s3,
            args.endpoint_name,
            location,
            body,
            ctype,
            custom_attributes(model, args.option),
            args.invocation_timeout,
        )
        outcome = invoke_async.wait_for_answer(
            s3,
            queued["OutputLocation"],
            queued.get("FailureLocation"),
            label=model,
            timeout_s=args.wait_timeout,
            poll_s=args.poll_seconds,
        )
    except ClientError as e:
        return False, error_lines(model, e), None
    except invoke_async.NoAnswer as e:
        return False, [f"{model}: {e}"], None
    if not outcome.ok:
        failure = outcome.body.decode(errors="replace")
        return False, failure_lines(f"{model}: failed ({outcome.location})", failure), None
    return answer_lines(model, outcome.body)


def invoke_tools(client, args: argparse.Namespace, model: str, body: bytes) -> tuple[bool, list[str], Any]:
    """A function-calling call (--tools): the text asked with the tools, the text and calls printed."""
    body = chat_body(model, body.decode(), read_tools(args.tools), args.option)
    ok, lines, answer = invoke(client, args.endpoint_name, model, body, "application/json", (), route(args))
    return (ok, chat_lines(model, answer), answer) if ok and isinstance(answer, dict) else (ok, lines, answer)


def _pairs(items: Sequence[str]) -> list[tuple[str, Path]]:
    pairs = []
    for item in items:
        model, sep, path = item.partition("=")
        if not sep or not model or not path:
            raise SystemExit(f"invoke: {item!r}: expected MODEL=FILE")
        pairs.append((model, Path(path)))
    return pairs


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m scripts.caller invoke",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(parser)
    args = parser.parse_args(argv)
    check_arguments(parser, args)
    return args


def caller(args: argparse.Namespace, client, s3) -> Callable[[str, bytes, str], tuple[bool, list[str], Any]]:
    """How each (model, body, content type) is sent: real-time, or queued with --async."""

    def call(model: str, body: bytes, ctype: str) -> tuple[bool, list[str], Any]:
        if args.async_prefix:
            return invoke_queued(client, s3, args, model, body, ctype)
        if args.tools:
            return invoke_tools(client, args, model, body)
        if args.json_schema:
            schema = read_json(args.json_schema, "--json-schema", dict, "a JSON Schema object")
            structured = schema_body(model, body.decode(), schema, args.option)
            return invoke(client, args.endpoint_name, model, structured, "application/json", (), route(args))
        if args.stream:
            from botocore.exceptions import ClientError

            try:
                return invoke_streamed(client, args.endpoint_name, model, body.decode(), args.option, route(args))
            except ClientError as error:
                return False, error_lines(model, error), None
        return invoke(client, args.endpoint_name, model, body, ctype, args.option, route(args))

    return call


def main(argv: Sequence[str] | None = None, client=None, s3=None) -> int:
    args = parse_args(argv)
    calls: list[tuple[str, bytes, str]] = []
    if args.calls:
        for model, path in _pairs(args.calls):
            if not path.is_file():
                print(f"invoke: {path}: no such file", file=sys.stderr)
                return 2
            calls.append((model, path.read_bytes(), content_type(path)))
    else:
        if args.image is None:
            print("invoke: give MODEL=FILE pairs, or --image (and optionally --text)", file=sys.stderr)
            return 2
        calls += [(m, args.image.read_bytes(), content_type(args.image)) for m in IMAGE_MODELS]
        calls += [(m, args.text.encode(), CONTENT_TYPES[".txt"]) for m in TEXT_MODELS]
    client = client or make_client(args.region, args.endpoint_url)
    if args.async_prefix:
        s3 = s3 or invoke_async.make_s3_client(args.region)
    call = caller(args, client, s3)
    failed = 0
    images = [model for model, _, ctype in calls if ctype.startswith("image/")]
    for model, body, ctype in calls:
        ok, lines, result = call(model, body, ctype)
        print("\n".join(lines), flush=True)
        failed += not ok
        if ok and args.draw is not None and ctype.startswith("image/"):
            path = args.draw if len(images) == 1 else args.draw.with_name(f"{args.draw.stem}-{model}{args.draw.suffix}")
            failed += not drawn(body, result, path, model)
    return 1 if failed else 0


def drawn(body: bytes, result: Any, path: Path, model: str) -> bool:
    from scripts.caller.drawing import NotDrawable, draw_answer, save

    try:
        print(f"  drawn: {save(draw_answer(body, result), path)}", flush=True)
    except NotDrawable as error:
        print(f"invoke: {model}: nothing drawn: {error}", file=sys.stderr)
        return False
    return True
