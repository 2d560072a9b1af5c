"""The named presets (`common/presets.py`, where the rewards layer can read them too)."""

from common.presets import PRESETS, get_preset  # noqa: F401
