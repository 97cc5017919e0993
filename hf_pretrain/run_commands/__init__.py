"""The commands a person runs on a run, wherever it lives: `status` (where it stands), `stop` (a request it
answers) and `report` (its plots and page)."""
