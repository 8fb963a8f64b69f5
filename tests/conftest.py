"""Shared pytest configuration for the zidane_actors test suite."""

from hypothesis import settings

# The machine is shared and loaded: time budgets are the benchmarks' business, not the tests'.
settings.register_profile("zidane", deadline=None)
settings.load_profile("zidane")
