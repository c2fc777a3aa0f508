"""What only ``run_scheduler`` executes: the tick loop, attempts, claims, scheduling of due minutes,
the batching journal writer and the clocks (docs/architecture.md)."""
