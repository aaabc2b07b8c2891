"""The web edge: the Starlette app and its routes (app, api), the front door (access), how uvicorn
serves (serving, ws_guard, workers), one socket's state machine (connection), its rate limit
(limits), and the export formats (export, markdown).
"""
