"""Where and how a run executes: the GPU table, the precisions, the device's facts, and the run profile built from them. Below everything that reads them."""
