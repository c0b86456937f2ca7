"""scripts/sagemaker/filter_pattern.py: CloudWatch Logs JSON filter patterns and metric transformations
evaluated offline -- which access lines a metric filter selects, and what it publishes for them."""

from __future__ import annotations

import json

import pytest

from scripts.sagemaker.filter_pattern import FilterPatternError, Pattern, Published, parse, publish

LINE = {
    "logger": "app.access",
    "model": "resnet",
    "status": 200,
    "duration_ms": 12.5,
    "triton_ms": 9.1,
    "request_id": "ab12",
    "path": "/invocations",
    "cached": False,
    "error": None,
    "client": {"ip": "10.0.0.7", "agent": "curl/8.5"},
}


def line(**changes) -> str:
    """The access line as JSON text, with fields changed (a value of ... removes the field)."""
    fields = {**LINE, **changes}
    return json.dumps({k: v for k, v in fields.items() if v is not ...})


@pytest.mark.parametrize(
    ("pattern", "expected"),
    [
        ('{ $.logger = "app.access" }', True),
        ("{ $.logger = app.access }", True),
        ('{ $.logger = "app.acces" }', False),
        ('{ $.logger != "app.access" }', False),
        ("{ $.logger != app.router }", True),
        ('{ $.path = "/invoc*" }', True),
        ('{ $.path = "*tions" }', True),
        ('{ $.path = "/in*ons" }', True),
        ('{ $.path = "/in*x" }', False),
        ('{ $.path != "/models*" }', True),
        ('{ $.request_id = "*" }', True),
        ('{ $.status = "*" }', True),
        ('{ $.status = "200" }', False),
        ('{ $.cached = "*" }', False),
    ],
)
def test_string_comparisons_with_quoted_and_unquoted_values_and_wildcards(pattern: str, expected: bool):
    assert parse(pattern).matches(line()) is expected


def test_a_quoted_value_may_hold_escaped_quotes_spaces_and_pattern_punctuation():
    assert parse(r'{ $.agent = "say \"hi\" && (go) }" }').matches({"agent": 'say "hi" && (go) }'})
    assert parse(r'{ $.agent = "a\*b" }').matches({"agent": "a*b"})
    assert not parse(r'{ $.agent = "a\*b" }').matches({"agent": "axxb"})


@pytest.mark.parametrize(
    ("value", "expected"),
    [("x", True), (0, True), (2.5, True), (False, True), ({"a": 1}, True), ([1], True), (None, False), (..., False)],
)
def test_equals_star_needs_the_field_present_and_not_null(value, expected: bool):
    assert parse("{ $.f = * }").matches(json.dumps({} if value is ... else {"f": value})) is expected


@pytest.mark.parametrize(
    ("pattern", "status", "expected"),
    [
        ("{ $.status >= 500 }", 500, True),
        ("{ $.status >= 500 }", 499, False),
        ("{ $.status > 499 }", 500, True),
        ("{ $.status < 500 }", 500, False),
        ("{ $.status <= 500 }", 500, True),
        ("{ $.status = 500 }", 500, True),
        ("{ $.status = 500.0 }", 500, True),
        ("{ $.status != 500 }", 200, True),
        ("{ $.status != 500 }", 500, False),
        ("{ $.status >= 500 }", "500", False),
        ("{ $.status != 500 }", "200", False),
        ("{ $.status = 500 }", "500", False),
        ("{ $.status > 0 }", True, False),
        ("{ $.status > -1.5e2 }", -100, True),
    ],
)
def test_numeric_comparisons_hold_only_for_json_numbers(pattern: str, status, expected: bool):
    assert parse(pattern).matches(line(status=status)) is expected


@pytest.mark.parametrize(
    ("pattern", "expected"),
    [
        ("{ $.duration_ms > 12.4 && $.duration_ms < 12.6 }", True),
        ("{ $.triton_ms >= 9.1 }", True),
        ("{ $.triton_ms > 9.1 }", False),
        ("{ $.duration_ms >= .5 }", True),
    ],
)
def test_float_fields_and_literals(pattern: str, expected: bool):
    assert parse(pattern).matches(line()) is expected


@pytest.mark.parametrize(
    ("pattern", "expected"),
    [
        # && binds tighter: true || (false && false)
        ('{ $.model = "resnet" || $.status = 500 && $.logger = "x" }', True),
        ('{ ($.model = "resnet" || $.status = 500) && $.logger = "x" }', False),
        # (false && true) || false
        ('{ $.model = "bert" && $.status = 200 || $.logger = "x" }', False),
        ('{ $.model = "bert" && ($.status = 200 || $.logger = "app.access") }', False),
        ('{ (($.model = "resnet")) && ($.status = 200 || $.status = 201) }', True),
        ("{$.status=200&&$.model=resnet}", True),
    ],
)
def test_and_binds_tighter_than_or_and_parentheses_group(pattern: str, expected: bool):
    assert parse(pattern).matches(line()) is expected


@pytest.mark.parametrize(
    ("pattern", "expected"),
    [
        ("{ $.error IS NULL }", True),
        ("{ $.model IS NULL }", False),
        ("{ $.missing IS NULL }", False),
        ("{ $.missing NOT EXISTS }", True),
        ("{ $.error NOT EXISTS }", False),
        ("{ $.cached IS FALSE }", True),
        ("{ $.cached IS TRUE }", False),
        ("{ $.status IS FALSE }", False),
        ("{ $.missing IS TRUE }", False),
    ],
)
def test_null_existence_and_boolean_conditions(pattern: str, expected: bool):
    assert parse(pattern).matches(line()) is expected


@pytest.mark.parametrize(
    "pattern",
    ['{ $.missing = "*" }', "{ $.missing = * }", '{ $.missing != "x" }', "{ $.missing != 1 }", "{ $.missing < 1 }"],
)
def test_a_missing_field_fails_every_condition_but_not_exists(pattern: str):
    assert not parse(pattern).matches(line())


def test_nested_selectors_and_array_indexes():
    assert parse('{ $.client.ip = "10.0.*" && $.client.agent = curl* }').matches(line())
    assert not parse("{ $.client.port = * }").matches(line())
    assert not parse("{ $.model.name = * }").matches(line())  # a string has no fields
    assert parse("{ $.items[1].n = 2 && $.items[5] NOT EXISTS }").matches({"items": [{"n": 1}, {"n": 2}]})


@pytest.mark.parametrize(
    "event", ["", "not json", "GET /ping 200", "[1, 2]", '[{"status": 200}]', '"text"', "42", "null", '{"status": 2']
)
def test_lines_that_are_not_json_objects_match_no_pattern(event: str):
    for pattern in ("{ $.status = * }", "{ $.missing NOT EXISTS }"):
        assert not parse(pattern).matches(event)


def test_an_already_parsed_event_and_the_pattern_value():
    pattern = parse("{ $.status = 200 }")
    assert pattern.matches(LINE)
    assert pattern == Pattern("{ $.status = 200 }")
    assert pattern.text == "{ $.status = 200 }"
    assert parse("{ $.a = 1 && ($.b.c = * || $.d NOT EXISTS) }").selectors == {"$.a", "$.b.c", "$.d"}


@pytest.mark.parametrize(
    ("pattern", "message"),
    [
        ("ERROR", "only JSON patterns"),
        ('"ERROR" "timeout"', "only JSON patterns"),
        ("[ip, user, status=5*]", "only JSON patterns"),
        ("%5\\d\\d%", "only JSON patterns"),
        ("", "only JSON patterns"),
        ("{ ($.status = 200 }", "expected ')'"),
        ("{ $.status = 200) }", "position 16"),
        ("{ $.status = 200", "end of pattern"),
        ("{ $.status 200 }", "position 11"),
        ("{ $.status = 200 && }", "expected a selector"),
        ("{ && $.status = 200 }", "expected a selector"),
        ("{ $.status = 200 || }", "expected a selector"),
        ("{ }", "expected a selector"),
        ("{ $.status = }", "expected a value"),
        ("{ $.status >= abc }", "needs a number"),
        ('{ $.status > "500" }', "needs a number"),
        ('{ $.model = "resnet }', "position 12"),
        ("{ $.model = %res.*% }", "regular expressions"),
        ("{ $.model != * }", "only '= *'"),
        ("{ $.cached = true }", "IS TRUE"),
        ("{ $.model IS EMPTY }", "NULL, TRUE or FALSE"),
        ("{ $.model NOT NULL }", "EXISTS"),
        ("{ $.model is null }", "position 10"),
        ("{ model = resnet }", "position 2"),
        ("{ $.status = 200 } extra", "end of pattern"),
    ],
)
def test_malformed_or_unsupported_patterns_are_refused_naming_where(pattern: str, message: str):
    with pytest.raises(FilterPatternError, match=message.replace("(", r"\(").replace(")", r"\)").replace("*", r"\*")):
        parse(pattern)
    assert issubclass(FilterPatternError, ValueError)


def metric_filter(pattern: str, **transformation) -> dict:
    """``logs.put_metric_filter``'s keyword arguments, with one transformation."""
    return {
        "logGroupName": "/aws/sagemaker/Endpoints/ep",
        "filterName": "ep/metric",
        "filterPattern": pattern,
        "metricTransformations": [{"metricName": "M", "metricNamespace": "NS", **transformation}],
    }


ACCESS = '{ $.logger = "app.access" && $.model = * && $.request_id = * }'
BY_MODEL = {"Model": "$.model", "Request": "$.request_id"}


def test_a_count_with_dimensions_from_fields():
    count = metric_filter(ACCESS, metricValue="1", dimensions=BY_MODEL, unit="Count")
    assert publish(count, line()) == [Published("M", "NS", 1.0, {"Model": "resnet", "Request": "ab12"}, "Count")]
    assert publish(count, line(logger="app.router")) == []


def test_a_numeric_dimension_field_is_stringified():
    count = metric_filter("{ $.status >= 200 && $.model = * }", metricValue="1", dimensions={"Status": "$.status"})
    assert publish(count, line())[0].dimensions == {"Status": "200"}


def test_a_value_from_a_field():
    latency = metric_filter(
        ACCESS[:-1] + "&& $.duration_ms >= 0 }", metricValue="$.duration_ms", dimensions=BY_MODEL, unit="Milliseconds"
    )
    (published,) = publish(latency, line())
    assert (published.metric, published.namespace, published.value, published.unit) == ("M", "NS", 12.5, "Milliseconds")
    assert publish(latency, LINE) == [published]  # an already-parsed line


@pytest.mark.parametrize("request_id", [..., None, True, {"id": 1}])
def test_a_line_whose_dimension_field_is_missing_or_not_a_string_or_number_publishes_nothing(request_id):
    dimensions = {"Request": "$.request_id", "Model": "$.model"}
    count = metric_filter("{ $.model = * || $.request_id IS NULL }", metricValue="1", dimensions=dimensions)
    assert publish(count, line(request_id=request_id)) == []


@pytest.mark.parametrize("duration", ["12.5", True, None, ...])
def test_a_value_field_that_is_not_a_json_number_publishes_nothing(duration):
    latency = metric_filter("{ $.model = * || $.duration_ms = * }", metricValue="$.duration_ms")
    assert publish(latency, line(duration_ms=duration)) == []


def test_default_value_is_published_for_lines_the_pattern_does_not_match():
    errors = metric_filter("{ $.status >= 500 }", metricValue="1", defaultValue=0, unit="Count")
    assert publish(errors, line(status=503)) == [Published("M", "NS", 1.0, {}, "Count")]
    assert publish(errors, line(status=200)) == [Published("M", "NS", 0.0, {}, "Count")]
    assert publish(errors, "not json") == [Published("M", "NS", 0.0, {}, "Count")]
    assert publish(metric_filter("{ $.status >= 500 }", metricValue="1"), line()) == []


def test_one_published_value_per_transformation():
    both = metric_filter(ACCESS, metricValue="1")
    both["metricTransformations"].append({"metricName": "T", "metricNamespace": "NS", "metricValue": "$.request_id"})
    assert [p.metric for p in publish(both, line())] == ["M"]  # "ab12" is no number: T publishes nothing


@pytest.mark.parametrize(
    ("transformation", "message"),
    [
        ({"metricValue": "1", "dimensions": {"Model": "$.model"}, "defaultValue": 0}, "defaultValue together"),
        ({"metricValue": "$.duration_ms"}, "does not match"),
        ({"metricValue": "1", "dimensions": {"Endpoint": "$.endpoint"}}, "does not match"),
        ({"metricValue": "1", "dimensions": {"Model": "resnet"}}, "field selector"),
        ({"metricValue": "duration_ms"}, "field selector"),
        ({"metricValue": "1", "dimensions": {c: "$.model" for c in "ABCD"}}, "at most 3"),
    ],
)
def test_transformations_cloudwatch_would_refuse_are_refused(transformation: dict, message: str):
    with pytest.raises(FilterPatternError, match=message):
        publish(metric_filter(ACCESS, **transformation), line())
    with pytest.raises(FilterPatternError, match=message):
        publish(metric_filter(ACCESS, **transformation), "not json")  # whether or not the line matches
