"""The text2text family's benchmark: ``python -m scripts.bench.generation`` (``make bench-generation``).

Why: a ``text2text_generation`` endpoint runs Hugging Face's own ``generate`` over ONNX Runtime inside
Triton's python backend, batching the texts of many callers; it must be worth running against what a
user would do without it, ``model.generate`` of the same folder in their own process. One run
measures both, side by side on one machine:

1. it prepares a repository (``build/bench-generation/repository``, or ``--repository``) with one
   realistic model (``prepare``): t5-small's architecture (6 + 6 layers, width 512, 8 heads) with
   seeded random weights and a Unigram tokenizer trained here, its vocabulary padded to t5-small's
   32,128 entries so that the language-model head costs what t5-small's does;
2. starts one stack on it (``serve`` on free ports, its default sizing, ``--env`` for another) and
   measures, in interleaved rounds (every row once a round, the order rotated each round), on the
   same 32 texts of about 20 tokens, each generating exactly ``--max-new-tokens`` (``min_new_tokens``
   equal to it: random weights never end a text early, and this makes it certain): single-text
   requests through the public port at concurrency 8 and 1, and ``model.generate`` (PyTorch, eager)
   in this process at batch 1 (texts one by one) and batch 8 (padded); beam search (``--beams``)
   at concurrency 8 against ``generate`` at batch 1;
3. reports per row requests/s, texts/s, generated tokens/s (the router's own counter of the tokens
   it returned, ``router_generated_tokens``, for the endpoint's rows), p50 latency, the batch
   Triton formed (its texts over its executions of the model), and the CPU by role (the router's
   gunicorn workers, Triton with its python-backend stub, this process) from their CPU-time
   clocks, with the CPU the machine spent outside the benchmark (``/proc/stat``);
4. writes ``results.json``, prints a markdown table and one PASS / FAIL line for the goal (the
   endpoint at concurrency 8 at least 1.5 x ``generate``'s tokens/s at batch 1) and ratio lines
   without a goal (against batch 8, beam search). It reports; it asserts nothing.

Modules by phase: ``plan`` (arguments, rows, settings), ``prepare`` (the model folder and the
repository), ``endpoint`` (the stack, its callers and counters), ``run`` (``generate``'s side, the
rounds; ``main``), ``report`` (figures, verdicts, table, JSON). What every text benchmark shares
comes from ``scripts.bench.text`` and ``scripts.bench``.
"""
