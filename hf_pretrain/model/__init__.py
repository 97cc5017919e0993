"""The model: the recipe's Llama, its attention kernels, its initialisation (or init_from), the loss head and FP8."""
