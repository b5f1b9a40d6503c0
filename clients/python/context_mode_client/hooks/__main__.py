"""``python -m context_mode_client.hooks <client> <event>``: the agent hook (``cli.main``)."""
from .cli import main

main()
