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


class GeneratorBusyError(OrtspecError):
    """A generator was called while one of its streams is still open on this thread, or stayed busy past a
    call's ``wait_timeout``."""


class DraftFailedWarning(RuntimeWarning):
    """The drafter failed during a request: that request goes on with the target alone (its output stays the
    target's) and reports it in ``Stats.draft_error``; the next request drafts again."""


class DraftBugWarning(DraftFailedWarning):
    """The drafter failed with a programming error (TypeError, IndexError, AssertionError, ...): reported like
    any draft failure, and a test suite turns it into an error (``-W error::ortspec.DraftBugWarning``) so that
    a bug never hides behind the fallback."""
