"""Recipes of known model pairs (``*.toml``: sources, quantization, draft and decoding defaults), shipped in the wheel as
package data of ``ortspec.export.pairs`` and read by ``ortspec.export.recipes``."""
