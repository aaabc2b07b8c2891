"""Which provider/model route serves a call (resolver, classifier), how our estimate is calibrated
against a route's counts (calibration), and the context meter for that route (meter).
"""
