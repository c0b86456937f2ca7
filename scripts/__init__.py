"""Tools that run outside the serving container, one folder per when and where they run:

- ``model_prep/``: build time, the model repository from the models' ``model.toml``
  (``python -m scripts.model_prep``);
- ``sagemaker/``: the SageMaker side, ``python -m scripts.sagemaker COMMAND`` (``deploy``,
  ``build-and-push``, ``package-models``, ``cost``) and deploy's parts;
- ``caller/``: a caller's tools, ``python -m scripts.caller COMMAND`` (``invoke``, ``batch-local``);
- ``bench/`` and ``soak/``: the benchmark (``python -m scripts.bench``, ``scripts.bench.preprocessing``,
  ``scripts.bench.v2_check``) and the soak test (``python -m scripts.soak``) against a local stack;
- ``devtools.py``: the stack on free ports, process helpers, percentiles, shared by bench, soak and
  the tests; ``commands.py``: the ``COMMAND`` dispatch of ``sagemaker`` and ``caller``;
  ``terminal.py``: the positive-number argument type and the text table the commands print.

Entry points are a package's ``__main__`` (its work in ``cli.py``, or the command's own module);
every other module is a library. What runs inside Triton is ``app/triton/``.
"""
