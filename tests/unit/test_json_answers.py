"""The router's JSON answers (``app.router.handlers.json_bytes``): what json.dumps would say, in
compact UTF-8, and NaN or an infinity refused as json.dumps(allow_nan=False) refuses it."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from app.router.handlers import json_bytes, json_response


def test_an_answer_reads_back_as_what_was_answered_floats_to_the_last_bit():
    vector = np.random.default_rng(0).normal(size=384).astype(np.float32).tolist()
    body = {"modelname": "m", "version": "1", "result": [vector, {"word": "Zoë 漢字 🙂", "score": 0.5, "none": None}]}
    text = json_bytes(body)
    assert json.loads(text) == body
    assert [float(x) for x in json.loads(text)["result"][0]] == vector  # every float's shortest repr, no loss
    assert "Zoë 漢字 🙂".encode() in text  # UTF-8 as it is, not \\u escapes


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_nan_or_an_infinity_anywhere_is_refused_not_written_as_null(bad):
    with pytest.raises(ValueError):
        json_bytes({"result": [[0.1, bad]]})
    with pytest.raises(ValueError):
        json_bytes([{"score": bad}])


def test_a_response_carries_the_bytes_and_the_json_type():
    response = json_response({"a": [1, 2.5, None]}, 201)
    assert response.status_code == 201 and response.mimetype == "application/json"
    assert json.loads(response.get_data()) == {"a": [1, 2.5, None]}
