"""SpeculativeGenerator: loading a bundle's models, the public API (generate, stream), and requests checked before any work."""
from __future__ import annotations

from dataclasses import replace
import os
import time
from typing import Iterator, Sequence
import warnings

import numpy as np

from .checks import is_int
from .bundle import Bundle, load_bundle
from .config import DRAFTERS, SamplingConfig, SpeculationConfig, resolve_sampling
from .constrain import Constraint, ConstraintError, Vocabulary, grammar_for
from .context import DecodeContext, Shared
from .control import ProfileMemory
from .drafting import NoDrafter, PromptLookupDrafter, check_window, make_drafter
from .engine import LOGITS_PLACES, CausalLM, check_thread_pool
from .errors import BundleError, CacheOverflowError, DraftFailedWarning, IncompatibleModelsError, OrtspecError
from .logprobs import check_logprobs
from .tools import check_tools
from .loop import DecodeLoop, InvariantError
from .request import Request
from .results import Event, Result, Stats
from .text import TextCodec
from .verify import verify_dists

__all__ = ["SpeculativeGenerator", "Event", "Result", "Stats", "InvariantError", "decoding_vocab", "verify_dists"]

DRAFT_KV = ("auto", "own")  # where a self-draft's keys and values for committed text come from


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
            "vocabulary, or decode with drafter='prompt_lookup' or drafter='none'")
    return width


class SpeculativeGenerator:
    """Generates with a bundle's target, drafting with a model, n-grams, or nothing.

    One generation runs at a time on a generator and its siblings (they share the target): it may be shared
    between threads, and a call from another thread waits until the running one ends (as long as it takes, or
    ``wait_timeout`` seconds). A call on the thread whose stream is still open raises GeneratorBusyError at
    once; a stream releases the generator when it ends, is closed, or is garbage-collected.

    A drafter that fails during a request leaves that request to the target alone (the output stays the
    target's), which ``Stats.draft_disabled`` and ``Stats.draft_error`` report with a DraftFailedWarning; the
    next request drafts again.
    """

    def __init__(self, bundle: Bundle, target: CausalLM, drafter, codec: TextCodec | None,
                 draft_error: str | None = None, shared: Shared | None = None, memory: ProfileMemory | None = None):
        self.bundle = bundle
        self.target = target
        self.drafter = drafter
        self.codec = codec
        # why the bundle's draft model could not be loaded (every request then reports it), or None
        self.draft_error = draft_error
        self.vocab_size = decoding_vocab(bundle, codec, drafter.lm is not None)
        # one generation at a time, scratch arrays and the grammar's vocabulary, shared with siblings
        self.shared = shared or Shared()
        # the stored profile (step costs, acceptance) and what the last auto request learned, for the next one
        self.memory = memory or ProfileMemory(bundle.root, target.provider)
        self.sampled_verify = verify_dists  # the sampled rule; replaced only by exactness checks (negative controls)
        self.draft_sampling = "match"  # what the draft samples from (config.draft_sampling); never changes output
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
        manifest's "decoding", which a recipe sets), else "model"; a bundle without a draft model drafts by
        n-gram lookup, sized by the cost model (draft length "auto": target-only where lookups do not pay).

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
        if threads is not None and not is_int(threads, 1):
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
            raise BundleError(f"bundle {bundle.root} has no draft model: decode with drafter='prompt_lookup' or "
                              "drafter='none', or export the bundle with a draft")
        target = CausalLM(bundle.target, str(bundle.file(bundle.target.path)), provider, threads,
                          thread_pool=thread_pool, logits=logits)
        codec = TextCodec(bundle.tokenizer_file, bundle.tokenizer_config) if bundle.tokenizer_file else None
        failed = None
        if drafter in ("model", "hybrid"):
            try:
                lm = CausalLM(bundle.draft, str(bundle.file(bundle.draft.path)), provider, threads,
                              thread_pool=thread_pool, logits=logits)
                shared = draft_kv == "auto" and bundle.draft.source.get("kind") == "self" and lm.can_share(target)
                impl = make_drafter(drafter, lm, draft_window, target if shared else None)
            except BundleError:
                raise  # a manifest that misdescribes its graph is a broken bundle, not a runtime failure
            except (OrtspecError, OSError, MemoryError, RuntimeError) as exc:  # (onnxruntime's own failures)
                failed = f"the draft model failed to load ({type(exc).__name__}: {exc})"
                warnings.warn(f"{failed}; decoding with the target alone", DraftFailedWarning, stacklevel=2)
                impl = NoDrafter()
        else:
            impl = make_drafter(drafter)
        return cls(bundle, target, impl, codec, failed)

    def sibling(self, drafter: str) -> "SpeculativeGenerator":
        """Another generator over the same loaded models and target cache with another drafter: they run one
        generation at a time between them (a call on one while the other's stream is open waits, or on that
        stream's thread raises GeneratorBusyError)."""
        impl = self._drafter_named(drafter.replace("-", "_"), self.drafter.lm, self.drafter.source)
        return self._made(self.target, impl, self.shared, self.memory.sibling())

    def twin(self) -> "SpeculativeGenerator":
        """A generator with the same drafter over KV caches of its own (target and draft), on the same sessions:
        the weights stay in memory once, and each twin's requests keep their own cached text. A twin has a lock,
        scratch arrays and learned priors of its own, so twins may hold open streams at once; their passes must
        still run one at a time (the server's scheduler steps every request's rounds on one thread)."""
        target = self.target.twin()
        lm = self.drafter.lm.twin() if self.drafter.lm is not None else None
        source = target if self.drafter.source is not None else None
        impl = self._drafter_named(self.drafter.name, lm, source)
        return self._made(target, impl, Shared(vocabulary=self.shared.vocabulary), self.memory.sibling())

    def _drafter_named(self, drafter: str, lm, source):
        """A fresh drafter of kind ``drafter`` over the draft model ``lm`` (this generator's or a twin's)."""
        if drafter in ("model", "hybrid") and lm is None:
            raise ValueError(f"cannot make a {drafter!r} sibling of a generator with drafter {self.drafter.name!r}")
        return make_drafter(drafter, lm, self.drafter.window, source)

    def _made(self, target, impl, shared: Shared, memory: ProfileMemory) -> "SpeculativeGenerator":
        """A generator over ``target`` and ``impl`` that decodes as this one does (its rules and settings)."""
        made = SpeculativeGenerator(self.bundle, target, impl, self.codec, self.draft_error, shared, memory)
        made.draft_sampling, made.record_min_mass = self.draft_sampling, self.record_min_mass
        made.forced_drafts, made.sampled_verify = self.forced_drafts, self.sampled_verify
        return made

    def context(self) -> DecodeContext:
        """What a request's decode loop reads of this generator, as it is now."""
        return DecodeContext(self.target, self.drafter, self.vocab_size, self.codec, self.shared.scratch,
                             self.memory, self.profile, self.sampled_verify, self.draft_sampling, self.forced_drafts,
                             self._guess, self.record_min_mass, self.draft_error, self.LAZY_PREFILL)

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
        events.whole()  # before the first round: no per-round detokenizing
        ids: list[int] = []
        logprobs = [] if events.request.logprobs is not None else None
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
               logit_bias: dict | None = None, wait_timeout: float | None = None,
               prediction: str | Sequence[int] | None = None) -> "_Stream":
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

        ``prediction`` (OpenAI's Predicted Outputs): text the answer will mostly repeat (a file being edited), or
        its token ids. Its tokens are proposed as drafts where the answer follows it, in passes as long as the
        agreement has run, verified like any draft: the output is the target's whatever the prediction says
        (greedy token for token, sampled in distribution); only the speed changes. ``Stats.prediction_accepted``
        and ``prediction_rejected`` count its tokens proposed and accepted or rejected.

        ``wait_timeout``: while another thread's generation runs on this generator (or a sibling), wait at most
        this many seconds for it, then raise GeneratorBusyError (None: as long as it takes). The wait starts at
        the stream's first event.

        ``tools`` (OpenAI's function definitions) go to the chat template with ``messages`` (a template that never
        shows tools gets them in a system message); to hold the answer to a call, or to the model's choice of an
        answer or calls, pass ``response_format=ortspec.tools.held_format(tools, mode, self.codec.chat_template)``
        and read it with ``ortspec.tools.read_calls`` (what the server does for ``tool_choice``).
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
        if not is_int(max_new_tokens, 1):
            raise ValueError(f"max_new_tokens must be an integer >= 1, got {max_new_tokens!r}")
        if seed is not None and not is_int(seed, 0):
            raise ValueError(f"seed must be a non-negative integer or None, got {seed!r}")
        if wait_timeout is not None and (isinstance(wait_timeout, bool) or not isinstance(wait_timeout, (int, float))
                                         or not wait_timeout >= 0):
            raise ValueError(f"wait_timeout must be a number of seconds >= 0 or None, got {wait_timeout!r}")
        ids = self.encode_prompt(prompt, input_ids, chat=chat, system=system, messages=messages, tools=tools)
        need = len(ids) + max_new_tokens - 1
        if need > self.target.capacity:
            raise CacheOverflowError(
                f"prompt ({len(ids)} tokens) + max_new_tokens ({max_new_tokens}) needs {need} positions but the "
                f"target holds {self.target.capacity}; shorten the prompt or lower max_new_tokens")
        constraint = None if grammar is None else Constraint(grammar, self.shared.vocabulary, eos, len(ids))
        request = Request(ids, max_new_tokens, sampling, speculation, eos, seed, bool(strict),
                          constraint=constraint, logprobs=logprobs, prediction=self._prediction(prediction))
        return _Stream(self, request, wait_timeout)

    def adopt(self, stream: "_Stream", pauses: bool = False, crowd=None, hurry=None) -> "_Stream":
        """A stream not started yet, made by another generator over the same bundle (a twin, a sibling), run on
        this one's models instead: the same checked request (``pauses``, ``crowd``, ``hurry``: see ``_Stream.on``)."""
        if stream.generator.bundle is not self.bundle:
            raise ValueError("adopt() takes a stream of a generator over the same bundle")
        return stream.on(self, pauses, crowd, hurry)

    def _prediction(self, prediction) -> tuple[int, ...]:
        """A predicted output's token ids (text through the tokenizer, without special tokens), checked."""
        if prediction is None:
            return ()
        if isinstance(prediction, str):
            if self.codec is None:
                raise ValueError("this bundle has no tokenizer; pass the prediction as token ids")
            return tuple(self.codec.encode_text(prediction))
        try:
            ids = tuple(_token_id(t) for t in prediction)
        except TypeError:
            raise ValueError("prediction must be text or a sequence of token ids") from None
        bad = [t for t in ids if not 0 <= t < self.vocab_size]
        if bad:
            raise ValueError(f"prediction contains ids outside the vocabulary [0, {self.vocab_size}): {bad[:5]}")
        return ids

    def _grammar(self, response_format) -> str | None:
        """The grammar of a request's response format (None without one), checked before any model work."""
        if response_format is None:
            return None
        if self.codec is None:
            raise ConstraintError("structured output needs the bundle's tokenizer; this bundle has none")
        grammar = grammar_for(response_format)
        if self.shared.vocabulary is None:
            self.shared.vocabulary = Vocabulary(self.codec.tokenizer.to_str(), self.vocab_size)
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
    LAZY_PREFILL = 256  # unfed prompt tokens from which the first round runs without drafts

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
        if any(not is_int(i, 0) for i in ids):
            raise ValueError(f"eos_token_id must be an id >= 0 or a list of them, got {eos_token_id!r}")
        return frozenset(ids)


class _Stream:
    """Iterator over a generation's events. It runs the generator's models from its first event until it ends, is
    closed, or is garbage-collected (its rounds hold no reference back to it, so dropping the last one closes
    it at once)."""

    def __init__(self, gen: SpeculativeGenerator, req: Request, wait_timeout: float | None = None):
        self._gen, self._req, self._wait = gen, req, wait_timeout
        self._it: Iterator[Event] | None = None
        self._box: list = []  # (Stats, finish reason), once the generation is over

    @property
    def request(self) -> Request:
        """The request as checked (what the decode loop reads)."""
        return self._req

    @property
    def prompt_ids(self) -> list[int]:
        """The prompt's token ids (after the chat template), as fed to the target."""
        return list(self._req.prompt_ids)

    @property
    def generator(self) -> SpeculativeGenerator:
        return self._gen

    @property
    def result(self) -> tuple[Stats, str] | None:
        """(Stats, finish reason) once the generation is over ("interrupted" if closed before its end)."""
        return self._box[0] if self._box else None

    def whole(self) -> None:
        """Ask for no per-round text (the caller decodes all tokens at the end); before the first event only."""
        if self._it is not None:
            raise RuntimeError("whole() must come before the stream's first event")
        self._req = replace(self._req, text=False)

    def __iter__(self):
        return self

    def __next__(self) -> Event:
        if self._it is None:
            self._it = _run(self._gen, self._req, self._wait, self._box)
        return next(self._it)

    def close(self) -> None:
        if self._it is not None:
            self._it.close()

    def on(self, gen: SpeculativeGenerator, pauses: bool = False, crowd=None, hurry=None) -> "_Stream":
        """This stream, not started yet, on another generator's models (``adopt``); with ``pauses``, also None
        after each chunk of a long prompt and between a round's drafts and pass (``crowd``, ``hurry``: Request's)."""
        if self._it is not None:
            raise RuntimeError("a stream moves to another generator only before its first event")
        return _Stream(gen, replace(self._req, pauses=pauses, crowd=crowd, hurry=hurry), self._wait)


def _run(gen: SpeculativeGenerator, req: Request, wait: float | None, box: list) -> Iterator[Event]:
    """A generation's rounds, holding the generator (a function, not a method: a stream dropped by its caller
    must not be kept alive by its own rounds, or it would never release the generator)."""
    busy = gen.shared.busy
    busy.acquire(wait)
    try:
        stats = Stats()
        t_lm = gen.target.run_time_s
        lm = gen.drafter.lm
        d_lm = lm.run_time_s if lm is not None else 0.0
        outcome: list = []
        t0 = time.perf_counter()
        try:
            yield from DecodeLoop(gen.context(), req, stats, outcome).rounds()
        finally:
            stats.total_time_s = time.perf_counter() - t0
            stats.target_time_s = gen.target.run_time_s - t_lm
            stats.draft_time_s = (lm.run_time_s - d_lm) if lm is not None else 0.0
            stats.overhead_time_s = max(0.0, stats.total_time_s - stats.target_time_s - stats.draft_time_s)
            box.append((stats, outcome[0] if outcome else "interrupted"))
    finally:
        busy.release()


def _token_id(value) -> int:
    """An integer token id (Python or NumPy integers); booleans and non-integral numbers are refused."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"input_ids must hold integer token ids, got {value!r}")
    return int(value)
