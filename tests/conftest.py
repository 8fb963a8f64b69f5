"""Shared pytest configuration for the zidane_actors test suite."""

import os

from hypothesis import settings

# The machine is shared and loaded: time budgets are the benchmarks' business, not the tests'.
# Every run draws the same examples (derandomize), so a red CI is a real regression, never
# a new random draw; `HYPOTHESIS_PROFILE=explore` searches afresh (and replays what it found).
settings.register_profile("zidane", deadline=None, derandomize=True)
settings.register_profile("explore", deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "zidane"))
