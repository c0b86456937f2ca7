"""The floor of the router's fixed cost: a bare Flask app with one JSON route.

``POST /invocations`` parses a small JSON body and answers a small JSON: what any Flask app under
the router's own gunicorn configuration (``app/router/gunicorn_conf.py``) and behind the router's
own NGINX configuration (``nginx.conf``) costs per request. A body with ``wait_ms`` is answered that
many milliseconds later (the thread sleeps): what the same app costs when its requests wait as long
as a model's do. ``scripts.bench.fixed_cost`` serves it
that way and compares the router's CPU per request with it.
"""

from __future__ import annotations

import time

from flask import Flask, jsonify, request

app = Flask(__name__)


@app.post("/invocations")
def invocations():
    body = request.get_json(force=True)
    if body.get("wait_ms"):
        time.sleep(body["wait_ms"] / 1000)
    return jsonify({"modelname": body.get("modelname"), "result": [1, 2, 3]})
