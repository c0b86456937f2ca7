"""The GPU checks: ``python -m scripts.gpu_check`` (``make gpu-check``; ``__main__``, the run in ``cli``),
and the DALI steps as Triton's DALI backend runs them (``serialized``), which tests/gpu imports too."""
