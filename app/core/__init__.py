"""The shared layer: errors, settings, the model spec, health and logs; no web framework, no gRPC."""
