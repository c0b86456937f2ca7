"""The serving side, one package per process, over a shared layer that imports no web framework.

- ``app.router``: the Flask router, run by gunicorn's workers (``/invocations``, ``/metrics``).
- ``app.serve``: the ``serve`` supervisor and its helpers (Triton launcher, ping server, NGINX
  configuration, TensorRT engine checks).
- ``app.core``: what every process and script shares: errors, settings, the model spec, ``/ping``'s
  answer, JSON logs. Standard library and numpy only.

The model clients (``clients``) sit between the router and the shared layer; the contract that
keeps the dependencies pointing one way is in ``pyproject.toml`` (``lint-imports``).
"""
