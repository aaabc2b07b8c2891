"""The session core: a session's frames (channel), its history owner (session), a turn (turn), the
reply it writes (reply), and the hub that routes what clients ask (hub, with cache, restore,
unsaved), plus what they show (views, notices, versions) and share (runtime, events, flusher).
"""
