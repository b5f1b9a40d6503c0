"""The agent hooks (``context-mode-hook <client> <event>``; clients/MCP.md, "Agent hooks"), a module per role:

- ``cli.py``: the command: its settings, the deadline and watchdog, the log, and ``main``;
- ``clients.py``: each agent's hook events read and answered in its own format;
- ``event.py``: the event JSON read from stdin, under a cap (the head of a larger one);
- ``store.py``: what an event carries stored as linked, masked units of its project, and the context given back;
- ``http.py``: the service's API over the standard library's sockets (no ``requests``: a hook's start is its cost);
- ``fence.py``: the fence around injected context, and the context taken out of what is stored again;
- ``gitremote.py``: a project's identity from its git remote, read from ``.git/config`` (no git process).

``python -m context_mode_client.hooks`` runs ``cli.main`` (``__main__.py``); ``context_mode_client.hook`` stays
for commands written before this package. This file imports nothing: a hook imports only what it needs.
"""
