"""agent-saga."""
