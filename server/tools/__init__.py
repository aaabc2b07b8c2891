"""Tools the turn loop can offer a model: the demo's built-in document lookup (demo).
"""
