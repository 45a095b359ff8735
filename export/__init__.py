"""ortspec.export: turn Hugging Face / GGUF causal LMs into ortspec bundles (needs the `export` extra)."""
from .api import export_bundle

__all__ = ["export_bundle"]
