"""meterchat: a browser chat server for LLMs with a context meter that follows the served route."""
