"""Parts of ``bench/load.py``: the paced fake provider, the bare relay, the load clients, the
process plumbing and the report. Each part runs in its own process."""
