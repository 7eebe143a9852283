"""Building blocks shared by several RTL blocks (each with its own unit test in tests/hw/lib/)."""
