"""What checking a KServe v2 body costs the router, in-process: ``python -m scripts.bench.v2_check``
(``__main__``, the measurement in ``cli``)."""
