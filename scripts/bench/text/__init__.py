"""The text families' benchmark: ``python -m scripts.bench.text`` (``make bench-text``).

Why: the text families (``text_classification``, ``token_classification``, ``sentence_embedding``)
must cost the router no more than the fill-mask it already served, and an embeddings endpoint must
be worth running against what a user would do without it, ``SentenceTransformer.encode`` in their
own process. One run measures both, side by side on one machine:

1. it prepares a repository (``build/bench-text/repository``, or ``--repository``) with realistic
   models (``prepare``): the real all-MiniLM-L6-v2, two MiniLM-sized classifiers with random
   weights, and the full-size ``bert_base`` fill-mask of the project's test repository;
2. starts one stack on it (``serve`` on free ports) and measures through its public port, in
   interleaved rounds (every row once a round, the order rotated each round, so that drift hits all
   rows alike), each family with short (10 tokens) and long (near the model's limit) texts:
   requests/s, texts/s, latency, and the router's CPU per request (the gunicorn workers' CPU time
   from their CPU-time clocks, in nanoseconds, divided by the requests);
3. in the same rounds, the embeddings comparison: requests of 32 texts, and single-text requests
   at concurrency 16, against ``encode(texts, batch_size=32)`` in this process, on the same texts;
4. writes ``results.json`` and prints a markdown table and one PASS / FAIL line per goal (the
   router's CPU per request within +0.3 ms of the fill-mask's; the ratios of the comparison). It
   reports; it asserts nothing. The machine is shared: each step also reads the CPU the machine
   spent outside the benchmark (``/proc/stat``), and rows whose rounds disagree get a noise line.

Modules by phase: ``plan`` (arguments, rows, the order of the steps, the texts), ``prepare`` (the
repository, through ``scripts.model_prep``), ``run`` (the stack, the callers, the rounds; ``main``),
``report`` (figures, verdicts, table, JSON).
"""
