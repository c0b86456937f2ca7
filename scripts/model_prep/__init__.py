"""Model preparation (build time): export the models of a repository to ONNX and write Triton's
files; ``python -m scripts.model_prep`` (``__main__``, the command in ``cli``)."""
