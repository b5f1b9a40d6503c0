"""The naive baseline of DESIGN.md section 10 (see app.py). It never imports ``service``."""
