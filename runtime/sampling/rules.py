"""What a lazily read row asks of the sampling rules that process it (``RowRules``, which LogitsPipeline is), and
the one decision of how verification reads a target row (``read_lazily``: a LazyRow, or the whole row)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, Sequence

from .dist import is_thin, nucleus_is_wide
from .rows import Row

if TYPE_CHECKING:
    from ..config import SamplingConfig
    from .dist import Dist
    from .processors import Processors


class RowRules(Protocol):
    """The rules a LazyRow settles its verdicts under (LogitsPipeline): what it reads of them and the counters
    it adds to."""

    config: SamplingConfig
    vocab_size: int
    processes: bool          # a processor (penalty, bad words, bias) changes some scores
    processors: Processors   # ... which ones and how: the same code whole rows go through
    lazy_settled: int        # verdicts settled from a row's largest entries
    lazy_read: int           # ... and those that needed the whole row

    def lazy_rows(self) -> bool:
        """Whether rows under these rules are settled lazily at all."""

    def row(self, logits, base: Sequence[int], new: Sequence[int] = (), inplace: bool = False) -> Dist:
        """The whole row's distribution."""

    def read_top(self, drow, k: int, base: Sequence[int], new: Sequence[int], found=None):
        """(ids, processed scores, bound) of a row's largest entries, or None where they settle nothing."""


def read_lazily(row, pipe: RowRules, base: Sequence[int], new: Sequence[int], last: bool) -> bool:
    """Whether verification reads a target row as a LazyRow (``LogitsPipeline.verify_row``), the one place
    this is decided: a row a pass returned with its largest entries, under rules that settle rows lazily
    (``lazy_rows``), unless its top-p nucleus is wide (``wide_nucleus``) or its head is thin (``thin_head``) and
    it is the ``last`` (only drawn from) or penalized (whose bookkeeping then buys little: a flat row's verdicts
    are rarely settled, its draws seldom). Which path reads a row never changes what it gives."""
    return isinstance(row, Row) and pipe.lazy_rows() and not wide_nucleus(row, pipe, base, new) and \
        not ((last or pipe.config.repetition_penalty != 1.0) and thin_head(row, pipe))


def thin_head(row, pipe: RowRules) -> bool:
    """Whether a dense row's head (the entries read but the last: each weighs at most the largest, 1) holds at
    most half of its mass (``is_thin``), told from the graph's normalizer: a draw from it then needs the whole
    row more often than not. (A penalty lowers some weights, so the raw normalizer is a rough guide there: this
    only chooses where the row is computed, never what is drawn.)"""
    if pipe.config.top_p < 1.0:
        return False
    norm = row.norm()
    return norm is not None and is_thin(norm[1])


def wide_nucleus(row, pipe: RowRules, base: Sequence[int] = (), new: Sequence[int] = ()) -> bool:
    """Whether a top-p row's nucleus must reach past its largest entries read (LAZY_TOP of them), told from the
    graph's normalizer: each weight is at most the largest one's, 1, so those entries hold at most LAZY_TOP of
    the total, and where top_p of the total is more, the nucleus keeps tokens not read. LazyRow could settle
    only verdicts on such a row (LazyRow._nucleus), and flat rows like these rarely accept a draft: the residual
    draw then reads the row whole anyway, so it is read whole at once. For rows as wide as the vocabulary (the
    normalizer is then the host's total, within 1e-5). Where processors change the row (context ``base +
    new``), they only lower scores (a penalty above 1, bans): every weight of an id they leave alone is at least
    its raw one (the largest processed score is at most the raw largest), and each one they change loses at most
    its raw weight, at most 1, so the host's total is at least the normalizer less the number of ids they may
    change. Which path reads a row never changes what it gives: this only chooses where it is computed."""
    cfg = pipe.config
    if cfg.top_p >= 1.0 or cfg.repetition_penalty < 1.0 or not isinstance(row, Row):
        return False
    norm = row.norm()
    if norm is None or row.width != pipe.vocab_size:
        return False
    scale, z_graph, _ = norm
    if abs(scale * cfg.temperature - 1.0) > 1e-9 or not nucleus_is_wide(cfg.top_p, z_graph):
        return False
    if pipe.processes:
        # (an id in two of the sets is counted twice: less)
        z_graph -= sum(map(len, pipe.processors.changed_ids(base, new)))
    return nucleus_is_wide(cfg.top_p, z_graph)
