"""SpeculativeGenerator: loading a bundle's models, the public API (generate, stream), and requests checked before any work."""
from __future__ import annotations

from dataclasses import dataclass, replace
import os
import threading
import time
from typing import Iterator, Sequence
import warnings

import numpy as np

from .bundle import Bundle, load_bundle
from .config import DRAFTERS, SamplingConfig, SpeculationConfig, resolve_sampling
from .constrain import Constraint, ConstraintError, Vocabulary, grammar_for
from .control import ProfileMemory
from .drafting import HybridDrafter, ModelDrafter, NoDrafter, PromptLookupDrafter, check_window
from .engine import LOGITS_PLACES, CausalLM, check_thread_pool
from .errors import BundleError, CacheOverflowError, IncompatibleModelsError
from .logprobs import check_logprobs
from .tools import check_tools
from .loop import DecodeLoop, InvariantError
from .results import Event, Result, Stats
from .sampling import Scratch
from .text import TextCodec
from .verify import verify_dists

__all__ = ["SpeculativeGenerator", "Event", "Result", "Stats", "InvariantError", "decoding_vocab", "verify_dists"]

DRAFT_KV = ("auto", "own")  # where a self-draft's keys and values for committed text come from


@dataclass(frozen=True)
class _Request:
    prompt_ids: list[int]
    max_new_tokens: int
    sampling: SamplingConfig
    speculation: SpeculationConfig
    eos: frozenset
    seed: int | None
    strict: bool
    text: bool = True  # text deltas per round (a stream's events); generate() decodes once at the end
    constraint: Constraint | None = None  # structured output: the mask every row is read through
    logprobs: int | None = None  # log-probabilities of the tokens chosen, with this many alternatives


def decoding_vocab(bundle: Bundle, codec: TextCodec | None, drafts_with_model: bool) -> int:
    """The ids decoding chooses among: the target's logits width, or the draft's where that is narrower and the
    ids it leaves out are padding (past every id the tokenizer knows: probability 0 for every drafter, so that
    speculative output stays distributed as target-only output). A draft narrower than the tokenizer's ids
    cannot propose tokens the target may choose: drafting with it is refused; the target alone decodes over
    its whole width."""
    width = bundle.target.output_vocab
    if bundle.draft is None or bundle.draft.output_vocab >= width:
        return width
    cut = bundle.draft.output_vocab
    tokens = codec.id_count() if codec is not None else None
    if tokens is not None and tokens <= cut:
        return cut
    if drafts_with_model:
        known = f"the tokenizer's ids reach {tokens - 1}" if tokens is not None else "the bundle has no tokenizer"
        raise IncompatibleModelsError(
            f"the draft's logits cover ids 0..{cut - 1} but the target's cover 0..{width - 1} and {known}: the "
            "draft cannot propose every token the target may choose; re-export the pair with drafts of the same "
            "vocabulary, or load with drafter='prompt_lookup' or 'none'")
    return width


class SpeculativeGenerator:
    """Generates with a bundle's target, drafting with a model, n-grams, or nothing.

    Calls on one generator are serialized by a lock: it may be shared between
    threads, and concurrent calls run one after another.
    """

    def __init__(self, bundle: Bundle, target: CausalLM, drafter, codec: TextCodec | None,
                 draft_disabled: bool = False):
        self.bundle = bundle
        self.target = target
        self.drafter = drafter
        self.codec = codec
        self.draft_disabled = draft_disabled
        self.vocab_size = decoding_vocab(bundle, codec, drafter.lm is not None)
        self._lock = threading.Lock()
        # the stored profile (step costs, acceptance) and what the last auto request learned, for the next one
        self.memory = ProfileMemory(bundle.root, target.provider)
        self._sampled_verify = verify_dists  # replaceable only by exactness checks (negative controls)
        self.draft_sampling = "match"  # what the draft samples from (config.draft_sampling); never changes output
        self._scratch = Scratch()  # vocabulary-wide arrays reused across rounds (calls hold the lock)
        self._vocabulary: Vocabulary | None = None  # the tokenizer as the grammar engine reads it (made once)
        self.forced_drafts = True  # tokens a constraint forces go out as free drafts (off: to measure what they buy)
        self._guess = PromptLookupDrafter()  # free one-token guesses for rounds without drafts (bitwise passes)
        # Sampling: sum_x min(p, q) of every verified position into Stats (bench turns it on). An auto gamma
        # learns from it and always computes it; otherwise it is host time that serves only the statistics
        # (without top-k, about a tenth of a round's time outside onnxruntime on SmolLM2).
        self.record_min_mass = False

    # -- construction -------------------------------------------------------
    @classmethod
    def load(cls, bundle_dir: str | os.PathLike, provider: str = "cpu", drafter: str | None = None,
             threads: int | None = None, verify: str = "full",
             thread_pool: str = "session", logits: str = "auto",
             draft_window: int | None = 512, draft_kv: str = "auto") -> "SpeculativeGenerator":
        """Load a bundle. drafter: "model" (the bundle's draft), "hybrid" (n-gram lookups where they match, the
        draft model otherwise), "prompt_lookup" or "none"; None (default): the bundle's own default (its
        manifest's "decoding", which a recipe sets), else "model".

        thread_pool: "session" (a thread pool per model, spinning only while that model runs) or "shared"
        (both models on onnxruntime's process-wide pool, as the commands run; about as fast, but onnxruntime
        then requires every later session in the process to use it, and export must run in another process).

        logits: how a decoding round reads its logits rows. Each pass also returns every kept row's largest
        entries (the graph's TopK; bundles exported before it lack them), which settle greedy and top-k sampling
        without reading the row. "device" leaves the rows on the execution provider's device and copies a row
        only where its top entries do not settle it; "host" reads every row whole; "auto" (default) is "device"
        on CUDA and, on the CPU, rows in host memory read through their top entries. Output is the same bits
        every way.

        draft_window: the draft model reads a long context as its first tokens plus about this many recent
        ones (None: all of it). A long prompt then costs the draft a window's prefill and its steps attend over
        a window; acceptance may change, the output never does. On long edit prompts (SmolLM2, 800-2,800
        tokens, measured on release 0.1) 512 kept acceptance (0.37 vs 0.40) and ran 0.73x target-only speed
        where the whole context ran 0.51x.

        draft_kv: "auto" (default) lets a self-draft (the target's own weights quantized: same layers and cache
        layout) run on the target's KV cache: it reads the target's keys and values for the committed text
        instead of computing its own, so it never reads the prompt (the first token is the target's prefill
        alone), drafts from the better model's cache and keeps no cache of its own; draft_window does not
        apply then. "own": the draft keeps its own cache.
        Acceptance may change, the output never does.
        """
        if not isinstance(bundle_dir, (str, os.PathLike)):
            raise ValueError(f"bundle_dir must be a path, got {type(bundle_dir).__name__}")
        drafter = drafter.replace("-", "_") if isinstance(drafter, str) else drafter
        if drafter is not None and drafter not in DRAFTERS:
            raise ValueError(f"drafter must be one of {', '.join(DRAFTERS)}, got {drafter!r}")
        if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
            raise ValueError(f"threads must be a positive integer or None, got {threads!r}")
        check_thread_pool(thread_pool)
        if logits not in LOGITS_PLACES:
            raise ValueError(f"logits must be one of {', '.join(LOGITS_PLACES)}, got {logits!r}")
        check_window(draft_window)
        if draft_kv not in DRAFT_KV:
            raise ValueError(f"draft_kv must be one of {', '.join(DRAFT_KV)}, got {draft_kv!r}")
        bundle = load_bundle(bundle_dir, verify=verify)
        drafter = drafter or bundle.default_drafter
        if (bundle.target.quantization or {}).get("method") == "int8":
            warnings.warn("this bundle's target uses dynamic INT8 quantization (one activation scale per pass), so "
                          "speculative output can differ from target-only output at near-ties; re-export it with "
                          "--target-quant int8w for bitwise-exact output", RuntimeWarning, stacklevel=2)
        if provider == "cuda" and drafter in ("model", "hybrid") and bundle.draft is not None and \
                (bundle.draft.quantization or {}).get("method") == "int8":
            warnings.warn("this bundle's draft uses dynamic INT8 (MatMulInteger), which onnxruntime runs on the CPU "
                          "even with the CUDA provider; for a GPU, re-export with --draft-quant int4",
                          RuntimeWarning, stacklevel=2)
        if drafter in ("model", "hybrid") and bundle.draft is None:
            raise BundleError(f"bundle {bundle.root} has no draft model; use drafter='prompt_lookup' or "
                              "'none', or export with --draft")
        target = CausalLM(bundle.target, str(bundle.file(bundle.target.path)), provider, threads,
                          thread_pool=thread_pool, logits=logits)
        codec = TextCodec(bundle.tokenizer_file, bundle.tokenizer_config) if bundle.tokenizer_file else None
        disabled = False
        if drafter in ("model", "hybrid"):
            try:
                lm = CausalLM(bundle.draft, str(bundle.file(bundle.draft.path)), provider, threads,
                              thread_pool=thread_pool, logits=logits)
                shared = draft_kv == "auto" and bundle.draft.source.get("kind") == "self" and lm.can_share(target)
                impl = cls._model_drafter(drafter, lm, draft_window, target if shared else None)
            except BundleError:
                raise  # a manifest that misdescribes its graph is a broken bundle, not a runtime failure
            except Exception as exc:
                warnings.warn(f"draft model failed to load ({exc}); decoding with the target alone",
                              RuntimeWarning, stacklevel=2)
                impl, disabled = NoDrafter(), True
        elif drafter == "prompt_lookup":
            impl = PromptLookupDrafter()
        else:
            impl = NoDrafter()
        return cls(bundle, target, impl, codec, disabled)

    @staticmethod
    def _model_drafter(kind: str, lm: CausalLM, window: int | None = None, source: CausalLM | None = None):
        model = ModelDrafter(lm, window, source)
        return HybridDrafter(model) if kind == "hybrid" else model

    def sibling(self, drafter: str) -> "SpeculativeGenerator":
        """Another generator over the same loaded models (no second copy in memory) with another drafter.

        Share it only within one thread: both use the same target cache.
        """
        drafter = drafter.replace("-", "_")
        if drafter == "none":
            impl = NoDrafter()
        elif drafter == "prompt_lookup":
            impl = PromptLookupDrafter()
        elif drafter in ("model", "hybrid") and self.drafter.lm is not None:
            impl = self._model_drafter(drafter, self.drafter.lm, self.drafter.window, self.drafter.source)
        else:
            raise ValueError(f"cannot make a {drafter!r} sibling of a generator with drafter {self.drafter.name!r}")
        twin = SpeculativeGenerator(self.bundle, self.target, impl, self.codec, self.draft_disabled)
        twin.memory, twin.draft_sampling, twin._scratch = self.memory.sibling(), self.draft_sampling, self._scratch
        twin.record_min_mass, twin._vocabulary = self.record_min_mass, self._vocabulary
        twin.forced_drafts = self.forced_drafts
        return twin

    def profile(self) -> dict | None:
        """This machine's calibrated step costs for the bundle (measured once, then read from disk)."""
        return self.memory.measured(self.target, self.drafter.lm)

    def stored_profile(self) -> dict | None:
        """The calibrated step costs stored for this machine, if any (never measures; see ``profile``)."""
        return self.memory.stored()

    @property
    def acceptance_prior(self) -> dict:
        """The last auto request's per-position acceptance per mode ("greedy", "sampled")."""
        return self.memory.acceptance_prior

    @property
    def timing_prior(self) -> dict:
        """The pass sizes the last auto request timed, per kind of pass (bitwise or not)."""
        return self.memory.timing_prior

    # -- public API ---------------------------------------------------------
    def generate(self, prompt: str | None = None, input_ids: Sequence[int] | None = None, **kwargs) -> Result:
        """Generate and return all new tokens at once (same arguments as stream)."""
        events = self.stream(prompt, input_ids, **kwargs)
        events._req = replace(events._req, text=False)  # before the first round: no per-round detokenizing
        ids: list[int] = []
        logprobs = [] if events._req.logprobs is not None else None
        for ev in events:
            ids.extend(ev.token_ids)
            if logprobs is not None and ev.logprobs:
                logprobs.extend(ev.logprobs)
        stats, reason = events.result  # type: ignore[attr-defined]
        text = self.codec.decode(ids) if self.codec else None
        return Result(ids, text, stats, reason, logprobs)

    def stream(self, prompt: str | None = None, input_ids: Sequence[int] | None = None, *,
               max_new_tokens: int = 64, do_sample: bool | None = None, temperature: float | None = None,
               top_k: int | None = None, top_p: float | None = None, repetition_penalty: float | None = None,
               bad_words_ids: Sequence[Sequence[int]] = (), seed: int | None = None,
               num_draft_tokens: int | str | None = None, eos_token_id: int | Sequence[int] | None = None,
               strict: bool = False, chat: bool = False, system: str | None = None,
               messages: Sequence[dict] | None = None, bitwise: bool = True,
               response_format=None, logprobs: int | None = None, tools: Sequence[dict] | None = None,
               logit_bias: dict | None = None) -> "_Stream":
        """Yield Events as tokens are committed. Arguments are checked before any work.

        The prompt is one of: ``prompt`` (text; with ``chat=True`` a user turn through the chat template),
        ``messages`` (a conversation [{"role": "system"|"user"|"assistant", "content": ...}, ...] through the
        chat template) or ``input_ids``. A conversation that continues an earlier call's (its messages plus the
        assistant's reply, then the next user turn) reuses that call's cached prefix: only new tokens are fed.

        Sampling settings left out (None) come from the bundle's generation_config.json, as in transformers'
        ``generate`` (see ``sampling_defaults``), else transformers' defaults: greedy; when sampling,
        temperature 1, top-k 50 (``top_k=0`` turns it off), top-p 1, no repetition penalty.
        ``num_draft_tokens`` left out is the bundle's default (``default_num_draft_tokens``).

        ``response_format`` constrains the answer: a JSON schema (a dict), ``{"regex": pattern}``,
        ``{"grammar": Lark or GBNF text}`` or ``"json"`` (any JSON object). Target and draft rows are masked
        alike, so the output is distributed exactly as constrained target-only decoding; tokens the constraint
        forces are drafted for free. Needs the ``structured`` extra.

        ``logprobs`` (0..20) asks for each token's log-probability under the distribution it was drawn from
        (the processed target distribution; when greedy, the softmax of the processed scores) and that many
        most likely alternatives: ``Event.logprobs`` and ``Result.logprobs``, one ``TokenLogprob`` per token.

        ``logit_bias`` ({token id: bias in [-100, 100]}) is added to those logits before the other processors (as
        transformers' sequence bias of one-token sequences); rows are then read whole.

        ``tools`` (OpenAI's function definitions) go to the chat template with ``messages``; to make the model
        call one, pass ``response_format=ortspec.tools.call_schema(tools, name)``; to hold its choice of an
        answer or calls, ``ortspec.tools.calls_or_answer(tools)``; read the answer with
        ``ortspec.tools.read_calls`` (what the server does for ``tool_choice``).
        """
        logprobs = check_logprobs(logprobs)
        grammar = self._grammar(response_format)
        eos = self._eos(eos_token_id)
        # as transformers' NoBadWordsLogitsProcessor: an end-of-sequence id alone is never a bad word
        words = tuple(tuple(w) for w in bad_words_ids if not (len(w) == 1 and w[0] in eos))
        sampling = SamplingConfig(**self.sampling_settings(
            do_sample=do_sample, temperature=temperature, top_k=top_k, top_p=top_p,
            repetition_penalty=repetition_penalty), bad_words_ids=words, logit_bias=logit_bias or ())
        if sampling.logit_bias and sampling.logit_bias[-1][0] >= self.vocab_size:
            raise ValueError(f"logit_bias names token {sampling.logit_bias[-1][0]}, past the vocabulary "
                             f"[0, {self.vocab_size})")
        speculation = SpeculationConfig(self.default_num_draft_tokens if num_draft_tokens is None
                                        else num_draft_tokens, bitwise=bitwise)
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be an integer >= 1, got {max_new_tokens!r}")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
            raise ValueError(f"seed must be a non-negative integer or None, got {seed!r}")
        ids = self.encode_prompt(prompt, input_ids, chat=chat, system=system, messages=messages, tools=tools)
        need = len(ids) + max_new_tokens - 1
        if need > self.target.capacity:
            raise CacheOverflowError(
                f"prompt ({len(ids)} tokens) + max_new_tokens ({max_new_tokens}) needs {need} positions but the "
                f"target holds {self.target.capacity}; shorten the prompt or lower max_new_tokens")
        constraint = None if grammar is None else Constraint(grammar, self._vocabulary, eos, len(ids))
        request = _Request(ids, max_new_tokens, sampling, speculation, eos, seed, bool(strict),
                           constraint=constraint, logprobs=logprobs)
        return _Stream(self, request)

    def _grammar(self, response_format) -> str | None:
        """The grammar of a request's response format (None without one), checked before any model work."""
        if response_format is None:
            return None
        if self.codec is None:
            raise ConstraintError("structured output needs the bundle's tokenizer; this bundle has none")
        grammar = grammar_for(response_format)
        if self._vocabulary is None:
            self._vocabulary = Vocabulary(self.codec.tokenizer.to_str(), self.vocab_size)
        return grammar

    @property
    def default_num_draft_tokens(self) -> int | str:
        """The draft length of a call that leaves it out: the bundle's (manifest "decoding"), else 4."""
        return self.bundle.default_num_draft_tokens

    def sampling_settings(self, **given) -> dict:
        """Sampling settings for a call: each one given (not None) wins, then the bundle's generation
        config, then transformers' defaults (greedy; temperature 1, top-k 50, top-p 1, no penalty)."""
        return resolve_sampling(self.bundle.sampling_defaults, **given)

    # -- the decode loop (loop.py) ---------------------------------------------
    def _rounds(self, req: _Request, stats: Stats, outcome: list) -> Iterator[Event]:
        return DecodeLoop(self, req, stats, outcome).rounds()

    LAZY_PREFILL = 256  # unfed prompt tokens from which the first round runs without drafts

    def _sync_drafter(self, committed) -> None:
        try:
            self.drafter.sync(committed)
        except Exception as exc:
            self._disable_draft(exc)

    def _disable_draft(self, exc: Exception) -> None:
        warnings.warn(f"draft model failed ({type(exc).__name__}: {exc}); continuing with the target alone",
                      RuntimeWarning, stacklevel=5)
        self.drafter = NoDrafter()
        self.draft_disabled = True

    # -- helpers --------------------------------------------------------------
    def encode_prompt(self, prompt: str | None = None, input_ids: Sequence[int] | None = None, *,
                      chat: bool = False, system: str | None = None,
                      messages: Sequence[dict] | None = None, tools: Sequence[dict] | None = None) -> list[int]:
        """The token ids ``stream`` would feed for these prompt arguments (checked the same way)."""
        if tools is not None:
            if messages is None:
                raise ValueError("tools go to the chat template with messages; pass messages=[...]")
            tools = check_tools(tools)
        if sum(x is not None for x in (prompt, input_ids, messages)) != 1:
            raise ValueError("pass exactly one of prompt (text), messages (a conversation) or input_ids (token ids)")
        if messages is not None:
            if system is not None:
                raise ValueError("with messages, put the system message first in messages instead of system=")
            if self.codec is None:
                raise ValueError("this bundle has no tokenizer; pass input_ids instead of messages")
            ids = self.codec.encode_messages(messages, tools)
        elif prompt is not None:
            if not isinstance(prompt, str) or not prompt:
                raise ValueError("prompt must be a non-empty string")
            if self.codec is None:
                raise ValueError("this bundle has no tokenizer; pass input_ids instead of prompt")
            ids = self.codec.encode(prompt, chat=chat, system=system)
        else:
            if chat:
                raise ValueError("chat=True needs a text prompt, not input_ids")
            try:
                ids = [_token_id(t) for t in input_ids]
            except TypeError:
                raise ValueError("input_ids must be a sequence of integers") from None
        if not ids:
            raise ValueError("the prompt encodes to no tokens; pass a longer prompt")
        bad = [t for t in ids if not 0 <= t < self.vocab_size]
        if bad:
            raise ValueError(f"input_ids contains ids outside the vocabulary [0, {self.vocab_size}): {bad[:5]}")
        return ids

    def _eos(self, eos_token_id) -> frozenset:
        if eos_token_id is None:
            return frozenset(self.bundle.eos_token_ids)
        ids = [eos_token_id] if isinstance(eos_token_id, int) else list(eos_token_id)
        if any(isinstance(i, bool) or not isinstance(i, int) or i < 0 for i in ids):
            raise ValueError(f"eos_token_id must be an id >= 0 or a list of them, got {eos_token_id!r}")
        return frozenset(ids)


class _Stream:
    """Iterator over a generation's events; holds the generator's lock while it runs."""

    def __init__(self, gen: SpeculativeGenerator, req: _Request):
        self._gen, self._req = gen, req
        self._it = self._run()
        self.result: tuple[Stats, str] | None = None

    @property
    def prompt_ids(self) -> list[int]:
        """The prompt's token ids (after the chat template), as fed to the target."""
        return list(self._req.prompt_ids)

    def __iter__(self):
        return self

    def __next__(self) -> Event:
        return next(self._it)

    def close(self) -> None:
        self._it.close()

    def _run(self) -> Iterator[Event]:
        gen, req = self._gen, self._req
        with gen._lock:
            stats = Stats(draft_disabled=gen.draft_disabled)
            t_lm = gen.target.run_time_s
            d_lm = gen.drafter.lm.run_time_s if gen.drafter.lm is not None else 0.0
            outcome: list = []
            t0 = time.perf_counter()
            try:
                yield from gen._rounds(req, stats, outcome)
            finally:
                stats.total_time_s = time.perf_counter() - t0
                stats.target_time_s = gen.target.run_time_s - t_lm
                lm = gen.drafter.lm
                stats.draft_time_s = (lm.run_time_s - d_lm) if lm is not None else 0.0
                stats.overhead_time_s = max(0.0, stats.total_time_s - stats.target_time_s - stats.draft_time_s)
                stats.draft_disabled = stats.draft_disabled or gen.draft_disabled
                self.result = (stats, outcome[0] if outcome else "interrupted")


def _token_id(value) -> int:
    """An integer token id (Python or NumPy integers); booleans and non-integral numbers are refused."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"input_ids must hold integer token ids, got {value!r}")
    return int(value)
