"""ortspec: exact speculative decoding on ONNX Runtime.

The runtime needs only onnxruntime, numpy, tokenizers and jinja2; the export
stage lives in `ortspec.export` and is the only part that imports torch.
"""
from .config import SamplingConfig, SpeculationConfig
from .errors import (BundleError, CacheOverflowError, DraftBugWarning, DraftFailedWarning, ExportError,
                     GeneratorBusyError, IncompatibleModelsError, ModelRunError, OrtspecError,
                     ProviderUnavailableError)
from .constrain import ConstraintError
from .generator import Event, InvariantError, Result, SpeculativeGenerator, Stats
from .logprobs import TokenLogprob

__version__ = "0.3.0"

__all__ = [
    "SpeculativeGenerator", "Result", "Stats", "Event", "SamplingConfig", "SpeculationConfig",
    "OrtspecError", "BundleError", "IncompatibleModelsError", "CacheOverflowError",
    "ProviderUnavailableError", "ModelRunError", "ExportError", "InvariantError", "ConstraintError", "TokenLogprob",
    "GeneratorBusyError", "DraftFailedWarning", "DraftBugWarning",
]
