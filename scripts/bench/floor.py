"""The floor of the router's fixed cost: a bare Flask app with one JSON route.

``POST /invocations`` parses a small JSON body and answers a small JSON: what any Flask app under
the router's own gunicorn configuration (``app/router/gunicorn_conf.py``) and behind the router's
own NGINX configuration (``nginx.conf``) costs per request. ``scripts.bench.fixed_cost`` serves it
that way and compares the router's CPU per request with it.
"""

from __future__ import annotations

from flask import Flask, jsonify, request

app = Flask(__name__)


@app.post("/invocations")
def invocations():
    body = request.get_json(force=True)
    return jsonify({"modelname": body.get("modelname"), "result": [1, 2, 3]})
