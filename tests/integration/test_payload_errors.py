"""The error rows of the API reference (docs/reference/api.md) about one model's payload, through NGINX:
missing and mistyped fields, images that are not usable, texts past a limit or in another encoding,
options out of range or of the wrong type; in the JSON envelope and as raw bodies (the table:
tests/payload_error_rows.py).

Each row is checked as in test_errors.py (the rows about the request as a whole): its status, code and
a message naming the field, its conformance to the OpenAPI description, /ping still 200 after it and no
gunicorn worker restarted by it.
"""

from __future__ import annotations

import pytest

from tests.payload_error_rows import CASES
from tests.support import assert_error_row

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_error_rows(stack, case):
    assert_error_row(stack, case)
