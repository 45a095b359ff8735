"""Host cost of the sampling rules alone: draft rows and a verification on synthetic rows, timed without models."""
from __future__ import annotations

import time

import numpy as np

from .sampling.rows import Row, Rows


# -- host cost of one round's sampling math (ortspec bench --micro) -------------------------------------
MICRO_SETTINGS = {
    "greedy": dict(do_sample=False),
    "temperature 0.7": dict(temperature=0.7),
    "temperature 0.2": dict(temperature=0.2),  # most of a row underflows exp2
    "top-k 50": dict(top_k=50),
    "top-p 0.9": dict(top_p=0.9),
    "T 0.7 + top-p 0.9": dict(temperature=0.7, top_p=0.9),
    "rep 1.1": dict(repetition_penalty=1.1),
    "rep 1.1 + top-p 0.9": dict(repetition_penalty=1.1, top_p=0.9),
    "bad words": dict(bad_words_ids=((5,), (7, 9), (11,))),
    "qwen (T0.7 p0.8 k20 rep1.05)": dict(temperature=0.7, top_p=0.8, top_k=20, repetition_penalty=1.05),
}


def micro_rows(kind: str, vocab: int, n: int, seed: int) -> np.ndarray:
    """Synthetic logits: "peaked" (a few tokens far ahead, like most LM rows) or "flat" (high entropy)."""
    rng = np.random.default_rng(seed)
    if kind == "peaked":
        rows = rng.standard_normal((n, vocab)) * 2.0
        rows[np.arange(n)[:, None], rng.integers(0, vocab, (n, 5))] += 14.0
    else:
        rows = rng.standard_normal((n, vocab)) * 0.5
    return rows.astype(np.float32)


class _GraphRows(Rows):
    """Synthetic rows as a pass returns them with the graph's TopK: each row's largest entries (found here,
    untimed, as the graph finds them inside the pass) beside the whole row; with a ``scale``, each row's
    normalizer too, as a target graph computes it (float32, in blocks of 32)."""

    def __init__(self, rows: np.ndarray, k: int, scale: float = 0.0):
        self.rows, self.k, self.scale = rows, k, scale
        self.block = 32 if rows.shape[1] % 32 == 0 else 1
        self.norms = None
        if scale > 0:
            e = np.exp((rows - rows.max(axis=1, keepdims=True)) * np.float32(scale))
            self.norms = e.reshape(rows.shape[0], -1, self.block).sum(axis=2).sum(axis=1)
        k = min(k, rows.shape[1])
        cols = np.argpartition(-rows, k - 1, axis=1)[:, :k] if k < rows.shape[1] else \
            np.tile(np.arange(rows.shape[1]), (rows.shape[0], 1))
        order = np.lexsort((cols, -np.take_along_axis(rows, cols, axis=1)), axis=1)
        self.cols = np.take_along_axis(cols, order, axis=1)
        self.values = np.take_along_axis(rows, self.cols, axis=1)

    def __len__(self) -> int:
        return self.rows.shape[0]

    def __getitem__(self, i):
        if isinstance(i, slice):
            part = _GraphRows.__new__(_GraphRows)
            part.rows, part.k, part.cols, part.values = self.rows[i], self.k, self.cols[i], self.values[i]
            part.scale, part.block, part.norms = self.scale, self.block, None if self.norms is None else self.norms[i]
            return part
        return _GraphRow(self, i)

    def top(self, k: int):
        """(ids, values, bound) arrays of every row, as DeviceRows.top."""
        return self.cols, self.values, self.values[:, -1]


class _GraphRow(Row):
    def __init__(self, rows: _GraphRows, i: int):
        self.rows_, self.i = rows, i

    def top(self, k: int) -> tuple[list, list, float]:
        r = self.rows_
        if k > r.k:
            raise ValueError(f"asked for {k} top entries, the pass returned {r.k}")
        values = r.values[self.i].tolist()
        return r.cols[self.i].tolist(), values, values[-1] if r.k < r.rows.shape[1] else -np.inf

    def numpy(self) -> np.ndarray:
        return self.rows_.rows[self.i]

    @property
    def width(self) -> int:
        return self.rows_.rows.shape[1]

    def norm(self) -> tuple[float, float, int] | None:
        r = self.rows_
        return None if r.norms is None else (r.scale, float(r.norms[self.i]), r.block)

    on_host = True  # the rows are made for each round: processed in place, as a pass's host buffer


MICRO_ROWS = ("top", "whole")


def micro_bench(vocab: int = 151_936, gamma: int = 4, repeats: int = 30, context: int = 500,
                settings: dict | None = None, cold_mb: int = 0, rows: str = "top") -> list[dict]:
    """Milliseconds of host math per speculative round: gamma draft rows (distribution + sample), then
    verification of gamma + 1 target rows, for peaked and flat rows; "all accepted" makes every target row
    needed (the worst case), "first rejected" the residual path. ``cold_mb``: that many MB are streamed
    through the caches (untimed) before each draft row and before the verification, as the model pass
    before each of them does in decoding (it streams the weights: 135 MB for SmolLM2's 8-bit draft, 540 MB
    for its fp32 target); the host math then costs several times its warm cost, the more so the more is
    streamed on a CPU with a large shared L3.

    ``rows``: "top" (default) hands the pipelines rows as a pass of a current bundle returns them, with each
    row's largest entries found by the graph (as many as the pipeline asks for; found untimed, since the graph
    finds them inside the pass); "whole" hands whole rows only (bundles exported before the graph's TopK,
    or ``logits="host"``)."""
    if rows not in MICRO_ROWS:
        raise ValueError(f"rows must be one of {', '.join(MICRO_ROWS)}, got {rows!r}")
    from .config import SamplingConfig
    from .sampling import LogitsPipeline, draft_pipeline
    from .verify import greedy_verify, verify_dists
    out = []
    evict = np.ones((int(cold_mb) << 20) // 4, dtype=np.float32) if cold_mb else None
    base = [int(t) for t in np.random.default_rng(0).integers(0, vocab, context)]
    for name, kw in (settings or MICRO_SETTINGS).items():
        cfg = SamplingConfig(**({"do_sample": True} | kw))
        pipe = LogitsPipeline(cfg, vocab)  # one per request, as in decoding (the context's token set is kept)
        draft_pipe = draft_pipeline(cfg, vocab, pipe.scratch)
        for kind in ("peaked", "flat"):
            for case in ("all accepted", "first rejected"):
                times = []
                for r in range(repeats):
                    pipe.scratch.new_round()  # (a round each, as in decoding: its arrays are reused)
                    target_rows = micro_rows(kind, vocab, gamma + 1, seed=r)
                    draft_rows = target_rows[:gamma].copy() if case == "all accepted" else \
                        micro_rows(kind, vocab, gamma, 99 + r)
                    if rows == "top":  # what each pass returns beside its rows (found untimed, as in the graph)
                        for pipeline in (pipe, draft_pipe):
                            if not pipeline.top_entries():
                                continue
                            if pipeline is pipe:
                                target_rows = _GraphRows(target_rows, pipe.top_entries(), pipe.norm_scale())
                            else:
                                draft_rows = _GraphRows(draft_rows, draft_pipe.top_entries())
                    rng = np.random.default_rng(r)
                    spent, tokens, dists = 0.0, [], []
                    for i in range(gamma + 1):  # gamma draft steps, then the verification
                        if evict is not None:
                            evict.sum()  # untimed: what the model pass before this piece does to the caches
                        t0 = time.perf_counter()
                        if i < gamma and not cfg.do_sample:
                            tokens.append(int(pipe.greedy(draft_rows[i:i + 1], base, tokens)[0]))
                        elif i < gamma:
                            q = draft_pipe.row(draft_rows[i], base, tokens, inplace=True)
                            dists.append(q)
                            tokens.append(q.sample(rng))
                        elif not cfg.do_sample:
                            greedy_verify(tokens, pipe.greedy(target_rows, base, tokens))
                        else:
                            verify_dists(tokens, dists, pipe.verify_rows(target_rows, base, tokens), rng)
                        spent += time.perf_counter() - t0
                    times.append(spent)
                out.append({"setting": name, "rows": kind, "case": case, "vocab": vocab, "gamma": gamma,
                            "cold_mb": int(cold_mb), "read": rows, "ms_per_round": 1000 * float(np.median(times)),
                            "p90_ms": 1000 * float(np.percentile(times, 90))})
    return out


def format_micro(rows: list[dict]) -> str:
    head = f"{'setting':<30}{'rows':<8}{'case':<16}{'ms/round':>9}{'p90 ms':>8}"
    caches = (f"{rows[0]['cold_mb']} MB streamed through the caches before each draft row and before the "
              "verification, as by the model passes" if rows[0].get("cold_mb") else
              "warm caches (--cold: as after a model pass)")
    read = ("rows with the graph's top entries (current bundles)" if rows[0].get("read", "top") == "top"
            else "whole rows (bundles without the graph's TopK, or logits='host')")
    lines = [f"host math per round: gamma = {rows[0]['gamma']} ({rows[0]['gamma']} draft rows, up to "
             f"{rows[0]['gamma'] + 1} target rows), vocabulary {rows[0]['vocab']}, {read}, {caches}", head,
             "-" * len(head)]
    for r in rows:
        lines.append(f"{r['setting']:<30}{r['rows']:<8}{r['case']:<16}{r['ms_per_round']:>9.3f}{r['p90_ms']:>8.3f}")
    return "\n".join(lines)
