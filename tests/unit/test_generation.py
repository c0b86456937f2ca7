"""The text2text family's contract and the Triton model's row handling, without a network: the
settings' defaults from a generation_config.json, their bounds, the checks a KServe v2 body meets
inside Triton, the grouping of rows by settings, each text's own deadline, and how a batched row is
cut back to what ``generate`` returns for that text alone."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from app.core import generation_contract
from app.triton.onnx_generate import Deadlines, padded, trimmed
from app.triton.text2text_model import Refused, Row, check_rows, groups, rows_of


def test_defaults_are_the_generation_configs_then_hugging_faces():
    assert generation_contract.defaults({}) == {s.name: s.default for s in generation_contract.SETTINGS}
    assert generation_contract.defaults({})["max_new_tokens"] == 20  # generate's default with no max_length anywhere
    found = generation_contract.defaults(
        {"max_length": 200, "min_length": 30, "num_beams": 4, "length_penalty": 2, "early_stopping": True}
    )
    assert found["max_new_tokens"] == 199 and found["min_new_tokens"] == 29
    assert found["num_beams"] == 4 and found["length_penalty"] == 2.0 and found["early_stopping"] is True
    # max_new_tokens wins over max_length; a value of the wrong type is not taken
    found = generation_contract.defaults({"max_length": 200, "max_new_tokens": 50, "early_stopping": "never"})
    assert found["max_new_tokens"] == 50 and found["early_stopping"] is False


def test_the_new_tokens_bound_follows_the_decoders_positions():
    assert (
        generation_contract.new_tokens_limit({"model_type": "t5", "n_positions": 512})
        == generation_contract.MAX_NEW_TOKENS
    )
    assert generation_contract.new_tokens_limit({"model_type": "bart", "max_position_embeddings": 64}) == 63
    assert generation_contract.new_tokens_limit({"model_type": "bart", "max_position_embeddings": 1024}) == 512


def test_end_ids_take_a_list_from_the_generation_config():
    assert generation_contract.end_ids({"eos_token_id": [1, 7]}, {"eos_token_id": 1}) == (1, 7)
    assert generation_contract.end_ids({}, {"eos_token_id": 2}) == (2,)


def arrays(texts: int = 2, tokens: int = 5, **settings) -> dict[str, np.ndarray]:
    found = {
        "input_ids": np.full((texts, tokens), 7, dtype=np.int64),
        "attention_mask": np.ones((texts, tokens), dtype=np.int64),
        generation_contract.TIMEOUT_MS: np.full((texts, 1), 1000, dtype=np.int64),
    }
    for setting in generation_contract.SETTINGS:
        value = settings.get(setting.name, setting.default)
        found[setting.name] = np.full((texts, 1), value, dtype=np.dtype(setting.dtype.lower().replace("fp", "float")))
    return found


@pytest.mark.parametrize(
    "change, fragment",
    [
        ({"input_ids": np.full((2, 5), 500, dtype=np.int64)}, "input_ids must be token ids from 0 to 99"),
        ({"attention_mask": np.zeros((2, 5), dtype=np.int64)}, "1 at each text's first token"),
        ({"attention_mask": np.full((2, 5), 2, dtype=np.int64)}, "attention_mask must be 0 or 1"),
        ({"attention_mask": np.ones((2, 4), dtype=np.int64)}, "must be [texts, tokens] alike"),
        (
            {"max_new_tokens": np.full((2, 1), 0, dtype=np.int32)},
            "max_new_tokens must be one value a text, from 1 to 40",
        ),
        ({"max_new_tokens": np.full((2, 1), 41, dtype=np.int32)}, "from 1 to 40"),
        ({"num_beams": np.full((2, 1), 9, dtype=np.int32)}, "num_beams must be one value a text, from 1 to 8"),
        ({"num_beams": np.full((1, 1), 2, dtype=np.int32)}, "num_beams must be one value a text"),
        ({"repetition_penalty": np.zeros((2, 1))}, "repetition_penalty"),
        ({generation_contract.TIMEOUT_MS: np.zeros((2, 1), dtype=np.int64)}, "timeout_ms"),
    ],
)
def test_a_v2_body_with_values_generate_cannot_take_is_refused_naming_them(change, fragment):
    with pytest.raises(Refused, match="request: ") as refused:
        check_rows({**arrays(), **change}, vocabulary=100, max_new_tokens=40, where="request")
    assert fragment in str(refused.value)


def test_good_rows_pass_and_carry_their_tokens_settings_and_deadline():
    given = arrays(num_beams=3)
    given["attention_mask"][1, 3:] = 0
    check_rows(given, vocabulary=100, max_new_tokens=40, where="request")
    rows = rows_of(4, given, now=10.0)
    assert [len(r.ids) for r in rows] == [5, 3]
    assert rows[0].request == 4 and rows[0].deadline == pytest.approx(11.0)
    assert dict(zip(generation_contract.SETTING_NAMES, rows[0].settings))["num_beams"] == 3


def test_rows_are_grouped_by_their_settings_in_order_and_cut_to_the_batch():
    ids = np.array([1], dtype=np.int64)
    rows = [Row(0, ids, ("a",), 0.0), Row(0, ids, ("b",), 0.0), Row(1, ids, ("a",), 0.0), Row(2, ids, ("a",), 0.0)]
    assert groups(rows, max_rows=8) == [[0, 2, 3], [1]]
    assert groups(rows, max_rows=2) == [[0, 2], [3], [1]]


def test_a_text_past_its_deadline_stops_and_only_its_beams():
    now = [0.0]
    deadlines = Deadlines([5.0, 10.0], clock=lambda: now[0])
    ids = torch.zeros((4, 3), dtype=torch.long)  # two texts, two beams each
    assert deadlines(ids, None).tolist() == [False] * 4
    now[0] = 6.0
    assert deadlines(ids, None).tolist() == [True, True, False, False]
    now[0] = 0.0  # once passed, it stays passed
    assert deadlines.passed.tolist() == [True, False]


def test_a_batched_row_is_cut_after_its_end_of_sequence():
    # the decoder's start token may be the end-of-sequence token itself (BART starts with </s>)
    assert trimmed(np.array([2, 5, 6, 2, 0, 0]), ends=(2,)).tolist() == [2, 5, 6, 2]
    assert trimmed(np.array([0, 5, 6, 1, 1, 1]), ends=(1,)).tolist() == [0, 5, 6, 1]
    assert trimmed(np.array([0, 5, 6, 7]), ends=(1,)).tolist() == [0, 5, 6, 7]  # ran to max_new_tokens
    assert trimmed(np.array([0, 5, 9, 3]), ends=(1, 9)).tolist() == [0, 5, 9]
    assert padded([np.array([0, 5]), np.array([0, 5, 6, 1])]).tolist() == [[0, 5, -1, -1], [0, 5, 6, 1]]
