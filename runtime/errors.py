"""Named exceptions. Each message says what went wrong and what to do."""


class OrtspecError(Exception):
    """Base class for every error ortspec raises on purpose."""


class BundleError(OrtspecError):
    """A bundle directory is missing, malformed, corrupted or unsafe."""


class IncompatibleModelsError(OrtspecError):
    """Draft and target do not share a tokenizer (vocabulary or special ids)."""


class CacheOverflowError(OrtspecError):
    """A sequence would exceed the model's maximum positions."""


class ProviderUnavailableError(OrtspecError):
    """The requested onnxruntime execution provider is not installed."""


class ModelRunError(OrtspecError):
    """onnxruntime failed while running a model."""


class ExportError(OrtspecError):
    """Export could not read a source model or write the bundle."""
