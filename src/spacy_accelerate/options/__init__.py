"""Stage 4: optimize()'s options, validated once (config, GPU options, the one record of the
options).
"""
