"""Backends: the in-process engine (engine.py) and an HTTP endpoint (http.py), imported on use."""
