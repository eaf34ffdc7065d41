"""Policy: turn forecasts into actions and evaluate policies offline."""
