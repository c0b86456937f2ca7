"""The text_generation family's benchmark: ``python -m scripts.bench.chat`` (``make bench-chat``).

Why: a ``text_generation`` endpoint runs a continuous-batching step scheduler over one exported ONNX
graph in Triton's python backend, each caller's tokens streamed as they are made; it must be worth
running against what a user would do without it, ``model.generate`` of the same folder in their own
process, and a short request must not wait behind long ones. One run measures both, side by side on
one machine:

1. it prepares a repository (``build/bench-chat/repository``, or ``--repository``) with one model
   (``prepare``): a Llama of about 34M parameters (width 384, 6 layers, grouped-query attention,
   32,000 tokens) with seeded random weights, the ``</s>`` row of its output layer zero (no
   generation ends early), and a BPE tokenizer trained here, padded to the vocabulary;
2. starts one stack on it (``serve`` on free ports, its default sizing, ``--env`` for another) and
   measures, in interleaved rounds (every row once a round, the order rotated each round), on the
   same 32 prompts of about 24 tokens, greedy, ``--max-new-tokens`` each: ``model.generate``
   (PyTorch, eager) in this process one prompt at a time; whole answers through the public port at
   concurrency 8 and 1; streamed answers at concurrency 8, each token's event timed on arrival; and a
   short streamed request (``--short-new-tokens``) sent one at a time, alone, then while 7 long
   streamed generations (``--long-new-tokens``) run;
3. reports per row generated tokens/s, tokens a call, the call's p50 latency, time to first token
   (TTFT) and inter-token latency (ITL) at p50 / p99, and the CPU by role (the router's gunicorn
   workers, Triton with its python-backend stub, this process) a generated token, with the CPU the
   machine spent outside the benchmark (``/proc/stat``);
4. writes ``results.json``, prints a markdown table and a PASS / FAIL line for each goal (the endpoint
   at concurrency 8 at least 3 x ``generate``'s tokens/s; the short request's TTFT beside the long
   generations at most 3 x its TTFT alone, p50), a ratio line without a goal (concurrency 1), and
   whether the endpoint's answer to the first prompt is ``generate``'s. It reports; it asserts nothing.

Modules by phase: ``plan`` (arguments, rows, comparisons), ``prepare`` (the model folder and the
repository), ``endpoint`` (the callers through the public port, the long generations), ``run``
(``generate``'s side, the rounds; ``main``), ``report`` (figures, verdicts, table, JSON). What every
generation benchmark shares comes from ``scripts.bench.generation``, ``scripts.bench.text`` and
``scripts.bench``.
"""
