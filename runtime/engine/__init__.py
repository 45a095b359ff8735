"""The engine: one class per model (CausalLM: session, binding, KV cache, host buffers) and the rows its passes hand out."""
from .graphs import kv_trim_graph, topk_graph
from .lm import CausalLM, pass_bounds
from .rows import DeviceRows, PassRow, TopRows
from .session import (GPU_INSTALL, LOGITS_PLACES, PROVIDERS, THREAD_POOLS, check_thread_pool, installed_builds,
                      providers_for, session_options, shared_thread_pool_active)
from .slots import HostSlot, HostSlots

__all__ = [
    "CausalLM", "pass_bounds", "DeviceRows", "PassRow", "TopRows", "HostSlot", "HostSlots", "kv_trim_graph",
    "topk_graph", "GPU_INSTALL", "LOGITS_PLACES", "PROVIDERS", "THREAD_POOLS", "check_thread_pool",
    "installed_builds", "providers_for", "session_options", "shared_thread_pool_active",
]
