"""The run folder's facts: its layout, its lock, JSON files written whole, the stop request."""
