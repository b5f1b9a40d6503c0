"""``python -m context_mode_client.hook <client> <event>``: the agent hooks' command before they became the
``hooks`` package. It stays, running the package's ``main`` and nothing else, because commands written before
the move still call it: the settings ``context-mode install`` wrote into agents' files, the Claude Code plugin's
``hooks/hooks.json`` an agent has cached, and configs pasted from earlier docs. New commands use
``context-mode-hook`` or ``python -m context_mode_client.hooks``."""
from .hooks.cli import main

if __name__ == "__main__":
    main()
