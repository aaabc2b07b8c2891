"""The durable side: the store interface (base), its two backends (sqlite, postgres, picked by
backends), numbered migrations and the session list's query (search). Knows nothing of turns or the
wire.
"""
