"""The soak test: ``python -m scripts.soak`` (``make soak``; ``__main__``, the run in ``cli``)."""
