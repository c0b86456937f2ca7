"""Caller-side tools: what a client of the endpoint (or of the local stack) runs.

``python -m scripts.caller COMMAND`` runs a command (``__main__``): ``invoke`` (``invoke.py``: each
model called with a file, through boto3; ``invoke_async.py`` for an asynchronous endpoint,
``drawing.py`` for ``--draw``) and ``batch-local`` (``batch_local.py``: a Batch Transform job's
requests against the local stack).
"""
