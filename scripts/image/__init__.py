"""The serving image: built with docker, or podman where docker has no daemon, and run as SageMaker
runs it (``python -m scripts.image build|run``; ``make image`` and ``make image-run``)."""
