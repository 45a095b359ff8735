"""ortspec.export: turn Hugging Face / GGUF causal LMs into ortspec bundles (needs the `export` extra)."""
from .api import export_bundle
from .config import ExportConfig

__all__ = ["export_bundle", "ExportConfig"]
