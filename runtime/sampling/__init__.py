"""The sampling rules: processors (processors) and warpers (pipeline), distributions and residuals (dist), rows as
passes hand them out (rows), rows verified from their largest entries (lazy) and when (rules), array kernels
(kernels), reused arrays (scratch). ``ortspec.reference`` is the plain statement every fast path here is tested against."""
from .dist import WIDE, Dist, TargetDist, drawn_head_first, is_thin, nucleus_is_wide, residual, residual_draw
from .kernels import (BLOCK_ROWS, HEAD_MIN, LAZY_TOP, LEAN_MAX, RESIDUAL_EPS, SPARSE_MAX, THIN_TOTAL,
                      acceptance_probability, array_head, block_sums, draw_weights, inverse_cdf_list, min_mass_lists,
                      sample_weights, top_candidates, top_head)
from .lazy import LazyRow
from .rules import RowRules, read_lazily, thin_head, wide_nucleus
from .pipeline import LogitsPipeline, draft_pipeline, top_p_filter
from .processors import MaskedProcessors, Processors
from .rows import Row, Rows
from .scratch import Scratch

__all__ = [
    "Dist", "TargetDist", "drawn_head_first", "is_thin", "nucleus_is_wide", "read_lazily", "RowRules", "residual",
    "residual_draw", "BLOCK_ROWS", "HEAD_MIN", "LAZY_TOP", "LEAN_MAX", "RESIDUAL_EPS", "SPARSE_MAX", "THIN_TOTAL",
    "acceptance_probability", "array_head", "block_sums", "draw_weights", "inverse_cdf_list", "min_mass_lists",
    "sample_weights", "top_candidates", "top_head", "WIDE", "LazyRow", "thin_head", "wide_nucleus",
    "LogitsPipeline", "draft_pipeline", "Processors", "MaskedProcessors", "top_p_filter", "Row", "Rows", "Scratch",
]
