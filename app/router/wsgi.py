"""gunicorn's entry point: each worker builds its own app (and gRPC client) after the fork."""

from app.router import create_app

app = create_app()
