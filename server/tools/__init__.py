"""Tools the turn loop can offer a model: MCP servers' tools (toolbox, connection, catalog, results,
and the stdio and http transports) and the demo's built-in document lookup (demo).
"""
