"""``python -m service.cli``: the ``context-mode`` command."""
from . import main

main()
