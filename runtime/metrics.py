"""The server's counters, gauges and histograms, written in Prometheus' text exposition format (GET /metrics)."""
from __future__ import annotations

import threading

# latency buckets in seconds: a token of a small model on a CPU to a long answer of a large one
BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
OUTCOMES = ("stop", "length", "cancelled", "error", "rejected")


class Histogram:
    def __init__(self, buckets=BUCKETS):
        self.buckets = tuple(buckets)
        self.counts = [0] * len(self.buckets)
        self.total, self.count = 0.0, 0

    def observe(self, value: float) -> None:
        for i, edge in enumerate(self.buckets):
            if value <= edge:
                self.counts[i] += 1
        self.total += value
        self.count += 1

    def lines(self, name: str, labels: str) -> list[str]:
        out = [f'{name}_bucket{{{labels},le="{edge:g}"}} {n}' for edge, n in zip(self.buckets, self.counts)]
        return out + [f'{name}_bucket{{{labels},le="+Inf"}} {self.count}', f"{name}_sum{{{labels}}} {self.total:.6f}",
                      f"{name}_count{{{labels}}} {self.count}"]


class Metrics:
    """What the server has done since it started. The worker thread records a request when it ends; the event
    loop reads the queue's gauges when /metrics is asked for. Every counter only grows."""

    def __init__(self, model_id: str):
        self.model_id = model_id
        self._lock = threading.Lock()
        self.requests = {o: 0 for o in OUTCOMES}
        self.prompt_tokens = self.generated_tokens = self.target_passes = self.draft_failures = 0
        self.forced_drafts = 0
        self.drafted: dict[tuple[str, int], int] = {}   # (drafter, draft position 1..) -> tokens proposed there
        self.accepted: dict[tuple[str, int], int] = {}  # ... and accepted there
        self.duration = Histogram()
        self.first_token = Histogram()

    def rejected(self) -> None:
        """A request refused before it ran (a full queue)."""
        with self._lock:
            self.requests["rejected"] += 1

    def finished(self, outcome: str, prompt_tokens: int, stats=None, drafter: str = "none",
                 seconds: float | None = None) -> None:
        """A request that was admitted has ended ("stop", "length", "cancelled" or "error"), with its Stats where it
        ran."""
        with self._lock:
            self.requests[outcome] += 1
            self.prompt_tokens += prompt_tokens
            if stats is None:
                return
            self.generated_tokens += stats.new_tokens
            self.target_passes += stats.rounds
            self.draft_failures += bool(stats.draft_disabled)
            self.forced_drafts += stats.forced
            for i, (proposed, accepted) in enumerate(zip(stats.proposed_at, stats.accepted_at)):
                key = (drafter, i + 1)
                self.drafted[key] = self.drafted.get(key, 0) + proposed
                self.accepted[key] = self.accepted.get(key, 0) + accepted
            if seconds is not None:
                self.duration.observe(seconds)
            if stats.new_tokens:
                self.first_token.observe(stats.first_token_s)

    def text(self, running: int, waiting: int, max_queue: int, parallel: int = 1, kv_bytes: int = 0) -> str:
        """The exposition: one HELP and TYPE line per family, then its samples."""
        m = f'model="{_label(self.model_id)}"'
        out: list[str] = []

        def family(name: str, kind: str, help_text: str, samples: list[str]) -> None:
            out.extend([f"# HELP {name} {help_text}", f"# TYPE {name} {kind}", *samples])

        with self._lock:
            family("ortspec_requests_total", "counter", "Requests by outcome (rejected: refused with 429).",
                   [f'ortspec_requests_total{{{m},outcome="{o}"}} {n}' for o, n in self.requests.items()])
            family("ortspec_prompt_tokens_total", "counter", "Prompt tokens of the requests that ran.",
                   [f"ortspec_prompt_tokens_total{{{m}}} {self.prompt_tokens}"])
            family("ortspec_generated_tokens_total", "counter", "Tokens generated.",
                   [f"ortspec_generated_tokens_total{{{m}}} {self.generated_tokens}"])
            family("ortspec_draft_tokens_total", "counter", "Draft tokens proposed, by drafter and draft position.",
                   [f'ortspec_draft_tokens_total{{{m},drafter="{d}",position="{p}"}} {n}'
                    for (d, p), n in sorted(self.drafted.items())])
            family("ortspec_accepted_tokens_total", "counter", "Draft tokens the target accepted, by drafter and "
                   "draft position.", [f'ortspec_accepted_tokens_total{{{m},drafter="{d}",position="{p}"}} {n}'
                                       for (d, p), n in sorted(self.accepted.items())])
            family("ortspec_forced_drafts_total", "counter", "Drafts a constraint forced (structured output).",
                   [f"ortspec_forced_drafts_total{{{m}}} {self.forced_drafts}"])
            family("ortspec_target_passes_total", "counter", "Target passes (decoding rounds).",
                   [f"ortspec_target_passes_total{{{m}}} {self.target_passes}"])
            family("ortspec_draft_failures_total", "counter", "Requests whose drafter failed (they went on "
                   "target-only).", [f"ortspec_draft_failures_total{{{m}}} {self.draft_failures}"])
            family("ortspec_queue_depth", "gauge", "Requests waiting to run.", [f"ortspec_queue_depth{{{m}}} {waiting}"])
            family("ortspec_queue_capacity", "gauge", "Requests that may wait (--max-queue).",
                   [f"ortspec_queue_capacity{{{m}}} {max_queue}"])
            family("ortspec_running_requests", "gauge", "Requests running (at most --parallel).",
                   [f"ortspec_running_requests{{{m}}} {running}"])
            family("ortspec_slots", "gauge", "Requests that may run at once (--parallel).",
                   [f"ortspec_slots{{{m}}} {parallel}"])
            family("ortspec_kv_cache_bytes", "gauge", "Bytes of K/V buffers the slots' caches hold.",
                   [f"ortspec_kv_cache_bytes{{{m}}} {kv_bytes}"])
            family("ortspec_request_duration_seconds", "histogram", "From the start of a request's run to its end.",
                   self.duration.lines("ortspec_request_duration_seconds", m))
            family("ortspec_time_to_first_token_seconds", "histogram", "From the start of a request's run to its "
                   "first token (the prompt's prefill).",
                   self.first_token.lines("ortspec_time_to_first_token_seconds", m))
        return "\n".join(out) + "\n"


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
