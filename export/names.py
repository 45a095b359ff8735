"""Names of the graph inputs and outputs a bundle's manifest refers to (shared by both graph builders)."""

DATA_SUFFIX = ".data"
KEEP_INPUT = "logits_to_keep"
# the largest logits of every kept row, found inside the pass: an int64 [1] input asks for K of them, and two
# outputs hold their values (float32) and columns [1, rows, K] (TopK: descending, ties by lower column)
TOP_LOGITS = {"k": "logits_top_k", "values": "top_values", "ids": "top_ids"}
# A target graph's normalizer per kept row: sum_i exp((logit_i - max) * scale), scale (float32 [1]) fed per request
# (1 / temperature). Summed in blocks of NORM_BLOCK entries, then over the blocks, where the width allows.
LOGITS_NORM = {"scale": "logits_norm_scale", "norm": "logits_norm"}
NORM_BLOCK = 32
