"""Benchmark: the product against the model-only ceiling and Triton's own SageMaker front end.

``python -m scripts.bench`` (``make bench``): against a running stack (``make run``: NGINX on
:8080, Triton gRPC on 127.0.0.1:8001), for each model and each concurrency, in one run and
interleaved (several short rounds; in each round every side runs one short step, in an order that
rotates from round to round) so that machine drift hits all sides alike:

- ``A-json`` / ``A-raw``: the product through the public port, JSON envelope with a base64 image
  (or text), and the raw body with the model in the custom-attributes header;
- ``B``: the model-only ceiling, Triton over gRPC with the already preprocessed tensor (a minimal
  client: one protobuf request built once, one channel, threads);
- ``C-json`` / ``C-binary``: the peer, Triton's own SageMaker front end, in a second Triton the
  benchmark starts on the same repository with ``SAGEMAKER_TRITON_DEFAULT_MODEL_NAME`` naming the
  model (the only way that front end picks its model), fed the preprocessed tensor as KServe v2
  JSON, and as ``application/vnd.sagemaker-triton.binary+json`` with binary outputs requested;
- ``B-nobatch`` (resnet): the same ceiling on a copy of the model without dynamic batching,
  served by that second Triton.

A trivial model (``identity``: echoes its token ids, no model work) measures the router's own
cost: the benchmark writes it into ``build/bench/``, starts its own ``serve`` on that repository
(with the three models beside it) on free ports, and compares A with B there. That stack also gives
the start-to-``/ping`` time and a router worker's resident memory after the run.

The sizing section (``--sizing-only`` alone, ``--no-sizing`` to skip it) prints ``serve``'s plan for
this machine and sets the image models' Triton pipelines, at concurrency 8, in two Tritons side by
side: the repository as ``serve`` sizes it against every instance count 1 (``scripts.bench.sized_counts``).

Writes ``build/bench/results.json`` and PNG plots into ``build/bench/``; prints every figure of
the targets table with its target and a pass / fall-short mark. ``--quick`` is a smoke run.

Modules: ``cli`` (arguments, the run, progress), ``payloads`` (what each side sends; the model-only
tensors come from the clients' own preprocessing), ``load`` (callers and the load loop),
``peers`` (the peer Triton, the benchmark's own stack and repositories), ``report`` (figures,
tables, plots), ``perf`` (the perf_analyzer cross-check), ``sizing`` (the sizing against count 1).
"""
