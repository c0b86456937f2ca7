"""Command-line tools of the project (run as files or with ``python -m scripts.<name>``)."""
