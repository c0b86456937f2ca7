"""OpenAI's paths' bodies and answers (``app/router/openai_paths.py``), without a stack: what
``/v1/embeddings`` takes and refuses, and its vectors in base64 as OpenAI encodes them."""

from __future__ import annotations

import base64

import numpy as np
import pytest

from app.core.errors import InvalidInput
from app.router import openai_paths


def test_an_embeddings_body_is_a_model_and_texts_and_the_base64_is_little_endian_float32():
    ask = openai_paths.embedding_ask({"model": "e", "input": "hello", "encoding_format": None, "user": "u"})
    assert ask == openai_paths.EmbeddingAsk("e", ("hello",), "float")
    vectors = [[0.5, -1.25, 3e-8], [1.0, 2.0, 3.0]]
    answer = openai_paths.embedding_list(openai_paths.EmbeddingAsk("e", ("a", "b"), "base64"), vectors, 7)
    assert answer["usage"] == {"prompt_tokens": 7, "total_tokens": 7} and answer["model"] == "e"
    decoded = [np.frombuffer(base64.b64decode(item["embedding"]), dtype="<f4") for item in answer["data"]]
    np.testing.assert_array_equal(decoded, np.asarray(vectors, np.float32))
    floats = openai_paths.embedding_list(openai_paths.EmbeddingAsk("e", ("a",)), vectors[:1], 1)["data"]
    assert floats == [{"object": "embedding", "index": 0, "embedding": vectors[0]}]


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        ({"input": "a"}, "model must name"),
        ({"model": "e", "input": []}, "non-empty list of texts"),
        ({"model": "e", "input": [[1, 2]]}, "token ids are not taken"),
        ({"model": "e", "input": "a", "encoding_format": "int8"}, "encoding_format must be one of float, base64"),
        ({"model": "e", "input": "a", "dimensions": 8}, "dimensions is not taken by /v1/embeddings"),
    ],
)
def test_an_embeddings_body_it_cannot_answer_is_refused_naming_the_field(body, fragment):
    with pytest.raises(InvalidInput, match=fragment):
        openai_paths.embedding_ask(body)
