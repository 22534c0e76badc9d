"""Continual-learning demo: a producer trains an NT3-like model on a drifting stream and publishes
versions; a consumer serves requests with the freshest version it has. See docs/DEMO.md."""
