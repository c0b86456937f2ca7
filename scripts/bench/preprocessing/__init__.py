"""An image model's preprocessing on the CPU, the router's against DALI's: ``python -m
scripts.bench.preprocessing`` (``__main__``, the measurement in ``cli``)."""
