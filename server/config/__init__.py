"""Settings: the declarative table (settings), loading it from TOML and the environment (load), the
rules values follow (checks), and the embedded demo profile (demo).
"""
