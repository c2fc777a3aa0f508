"""Real runner processes: their harness (processes, faults) and the tests of crashes, faults and outages."""
