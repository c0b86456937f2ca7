"""Model preparation: export the models of a repository to ONNX and write Triton's files."""
