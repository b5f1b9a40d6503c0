"""The naive baseline of docs/design.md §10 (see app.py). It never imports ``service``."""
