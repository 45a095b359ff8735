"""The engine: one class per model (CausalLM), the passes of its graph (Graph: session, binding, host buffers), its
KV cache (buffers and valid length) and the rows its passes hand out."""
from .graphs import kv_trim_graph, topk_graph
from .cache import GrowingCache, KVLayout, StaticCache
from .lm import CausalLM, PassNeed, pass_bounds
from .passes import PLAIN, Graph, PassOptions, Reading
from .rows import DeviceRows, PassRow, TopRows
from .session import (GPU_INSTALL, LOGITS_PLACES, PROVIDERS, THREAD_POOLS, check_thread_pool, installed_builds,
                      providers_for, session_options, shared_thread_pool_active)
from .slots import HostSlot, HostSlots

__all__ = [
    "CausalLM", "PassNeed", "pass_bounds", "Graph", "PassOptions", "PLAIN", "Reading", "KVLayout", "StaticCache",
    "GrowingCache", "DeviceRows", "PassRow", "TopRows", "HostSlot", "HostSlots", "kv_trim_graph", "topk_graph",
    "GPU_INSTALL", "LOGITS_PLACES", "PROVIDERS", "THREAD_POOLS", "check_thread_pool", "installed_builds",
    "providers_for", "session_options", "shared_thread_pool_active",
]
