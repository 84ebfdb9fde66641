"""spaCy glue: components, the shim, the proxy, the patch and its guards, warm-up, calibration
and persistence.
"""
