"""Live mode across instances (`[live] url`): Redis streams for frames (channel, append), turn
leases (lease, turns), the instance's connection (redis_live) and what meters share (shared).
"""
