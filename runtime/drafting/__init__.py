"""Drafters: the Drafter base class (what the decode loop asks of one) and each kind: none, model, n-gram lookup, hybrid, a
request's predicted output."""
from .base import Draft, Drafter, NoDrafter, check_window, common_prefix
from .hybrid import HybridDrafter
from .kinds import make_drafter
from .lookup import NgramIndex, Outcomes, PromptLookupDrafter
from .model import ModelDrafter
from .prediction import PredictionDrafter, PredictionIndex

__all__ = ["Draft", "Drafter", "NoDrafter", "check_window", "common_prefix", "HybridDrafter", "NgramIndex",
           "Outcomes", "PromptLookupDrafter", "ModelDrafter", "PredictionDrafter", "PredictionIndex", "make_drafter"]
