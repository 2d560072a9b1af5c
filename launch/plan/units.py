"""Units the card and RAM planners share (and nothing else, so neither imports the other)."""

GiB = 2**30
NF4_BYTES = 0.5 * 1.032
"""bytes per NF4 weight including bitsandbytes' double-quantised constants"""
