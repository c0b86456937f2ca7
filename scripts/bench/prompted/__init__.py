"""The prompted image families' benchmark: ``python -m scripts.bench.prompted`` (``make bench-prompted``).

Why: ``mask_generation`` (SAM, SAM-HQ) and ``zero_shot_object_detection`` (OWLv2, Grounding DINO) run their
checked ONNX graphs in Triton's python backend behind the router; each must be worth running against
what a user would do without it, the Hugging Face processor, model and post-processing in their own
process, one image a call; a SAM (SAM-HQ) request's eight boxes must cost little more than one box (the
image encoder runs once an image); and the chain of a detector and SAM (``grounded_segmentation``, where
the family is in the tree) must beat the two references run one after the other. One run measures
them side by side on one machine:

1. it prepares a repository (``build/bench-prompted/repository``, or ``--repository``) with the
   architectures at their real sizes and seeded random weights (``prepare``): sam-vit-base,
   sam-hq-vit-base, OWLv2 base/16 at 960 pixels, Grounding DINO tiny; ``--families`` picks which;
2. starts one stack on it (``serve`` on free ports, its default sizing, ``--env`` for another) and
   measures, in interleaved rounds (every row once a round, the order rotated each round), on the same
   sample photos (``make samples``), ``--images`` calls a row a round: each family's reference in this
   process (PyTorch, batch 1) and its endpoint through the public port at concurrency 4; SAM and SAM-HQ
   with 1 box and with 8 (seeded boxes of each photo), OWLv2 with four labels, Grounding DINO with their prompt;
3. reports per row images/s, a call's p50 and the CPU by role in cores (the router's gunicorn workers,
   Triton with its python-backend stubs, this process), with the CPU the machine spent outside the
   benchmark (``/proc/stat``): rows whose rounds disagree get a noise line;
4. writes ``results.json``, prints a markdown table and a PASS / FAIL line for each goal (each family's
   endpoint at least 1.0 x its reference's images/s; SAM's and SAM-HQ's request with 8 boxes at most
   1.3 x the time of one with 1), and an info line where the chain is not in the tree. It reports; it asserts nothing.

``--small --quick``: the same code on the small-model sets' tiny models, a smoke run of seconds.

Modules by phase: ``plan`` (arguments, rows, comparisons, prompts), ``prepare`` (the model folders and
the repository), ``references`` (the Hugging Face sides, shared with the fidelity tests), ``run`` (the
photos, the callers, the rounds; ``main``), ``report`` (figures, verdicts, table, JSON).
"""
