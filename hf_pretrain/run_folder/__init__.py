"""The run folder's facts: its layout, its lock, status.json, the stop request and the stop command."""
