"""Placeholder: the client lands with the integrations issue."""
