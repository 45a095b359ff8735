"""Choosing gamma: controllers (fixed, auto), the cost model, calibrated step costs, and what is kept between requests."""
from .calibrate import PROFILE_FILE, load_profile, measure, save_profile
from .controllers import (AutoController, Controller, FixedController, TimedFixedController, acceptance_mode,
                          make_controller, planning_costs, stored_acceptance)
from .costmodel import best_gamma, expected_tokens, predicted_speedup, target_cost
from .memory import ProfileMemory

__all__ = ["PROFILE_FILE", "load_profile", "measure", "save_profile", "AutoController", "Controller",
           "FixedController", "TimedFixedController", "acceptance_mode", "make_controller", "planning_costs",
           "stored_acceptance", "best_gamma", "expected_tokens", "predicted_speedup", "target_cost", "ProfileMemory"]
