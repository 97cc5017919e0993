"""The names a publishing command may be asked for, read by its flags without torch: an export's weight
precisions (publish/export.py maps each to its torch dtype) and the GGUF tensor types publish/gguf.py writes."""

DTYPE_NAMES = ("bf16", "fp16", "fp32")
GGUF_TYPES = ("f32", "f16", "bf16", "q8_0")
