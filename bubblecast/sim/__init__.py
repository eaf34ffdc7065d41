"""Pipeline schedules, the timing engine, workloads, scenarios, accounting and replay."""
