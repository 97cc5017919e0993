"""The commands a person runs on a run, wherever it lives: `status` (where it stands) and `stop` (a request it answers)."""
