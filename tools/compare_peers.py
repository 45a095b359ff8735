#!/usr/bin/env python3
"""Compare ortspec with other runtimes on the same pair and prompts, interleaved.

    python tools/compare_peers.py models/smollm2-135m --max-new-tokens 128 --out peers.json [--plot peers.png]
        [--peers transformers,genai] [--sample]
        [--llama-cpp ~/.cache/llama-cpp/bin --llama-cpp-target t.gguf --llama-cpp-draft d.gguf]
        [--fidelity fidelity.json]

Per prompt, in one process and rotating order, greedy decoding (or, with --sample, every runtime sampling at
temperature 0.7, top-p 0.8, top-k 20, repetition penalty 1.05):

* ortspec: target-only, the bundle's draft (fixed gamma and auto), prompt-lookup, hybrid (fixed gamma and auto);
* transformers (PyTorch, CPU, fp32, from the same source weights the bundle was
  exported from): target-only `generate`, prompt-lookup, and assisted generation
  with the draft's source model when the draft is a separate model (a quantized
  self-draft has no PyTorch counterpart);
* onnxruntime-genai on the bundle's own ONNX graphs (configs written with
  `ortspec export --genai-config`, done here when missing): target-only,
  draft-model speculative decoding (fixed K and adaptive K) and n-gram;
* llama.cpp, when its binaries are given (`../shared/tools/build-llama-cpp.sh` builds them; not installed by
  ortspec): target-only (`llama-cli`) and speculative with the draft GGUF (`llama-speculative-simple
  --spec-type draft-simple --spec-draft-n-max N`), each timed by llama.cpp's own decode counters (its
  prompt processing left out). With --llama-cpp, every ortspec row is timed the same way: from its first token
  to its last (decode-only; the prefill and the first token, and any first-request calibration, left out);
* ik_llama.cpp (--ik-llama-cpp: its binaries, from ../shared/tools/build-ik-llama-cpp.sh) on the same file,
  target-only with and without run-time repacking (`-rtr`), timed by its own eval counters; its llama-cli is
  the old "main", so it gets the prompt rendered by the chat template;
* OpenVINO GenAI (--openvino-python: an interpreter with openvino-genai, running tools/openvino_peer.py) on
  the same file: target-only, prompt lookup and, given --openvino-draft (an OpenVINO IR directory), draft-model
  speculation, decode-only by its own metrics; greedy, whether its text is ortspec target-only's.

Prints tokens/s per runtime, the median per-prompt ratio against ortspec
target-only, and (greedy) how many runs produced tokens different from ortspec
target-only (same graphs should give the same tokens); with llama.cpp, each row's
rate against llama.cpp's target-only rate; with --fidelity (tools/fidelity.py's
JSON), each side's top-1 agreement and mean KL against the file's float model on
the same windows, so that a faster row on a lossier model reads as such.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path
import re
import statistics
import subprocess
import sys
import time

from ortspec.shipped import DEV_PROMPTS, shipped

REPO = Path(__file__).resolve().parent.parent
SAMPLED = dict(temperature=0.7, top_p=0.8, top_k=20, repetition_penalty=1.05)  # Qwen2.5's recommended settings


def load_hf(source: dict):
    import torch
    from transformers import AutoModelForCausalLM
    ref = Path(source["ref"])
    kw = {"gguf_file": ref.name} if source["kind"] == "gguf" else {}
    where = str(ref.parent) if source["kind"] == "gguf" else source["ref"]
    model = AutoModelForCausalLM.from_pretrained(where, dtype=torch.float32, **kw).eval()
    return model


def hf_run(model, ids, max_new, eos, sampling=None, **kw) -> tuple[list[int], float]:
    import torch
    x = torch.tensor([ids])
    t0 = time.perf_counter()
    with torch.no_grad():
        out = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=max_new, do_sample=bool(sampling),
                             eos_token_id=eos, pad_token_id=eos[0], **(sampling or {}), **kw)
    return out[0, len(ids):].tolist(), time.perf_counter() - t0


def genai_models(bundle: Path, threads: int, gamma: int):
    """onnxruntime-genai models over the bundle's graphs: (target alone, target + draft or None)."""
    import onnxruntime_genai as og
    from ortspec.export.genai import CONFIG, write_genai_config
    if not (bundle / CONFIG).is_file():
        write_genai_config(bundle, max_draft_tokens=gamma)
    threads_opt = {"session_options": {"intra_op_num_threads": threads}}

    def model(where: Path, roles):
        cfg = og.Config(str(where))
        cfg.overlay(json.dumps({"model": {r: threads_opt for r in roles}}))
        return og.Model(cfg)
    alone = model(bundle / "target", ["decoder"])
    spec = model(bundle, ["decoder", "draft"]) if json.loads((bundle / CONFIG).read_text())["model"].get("draft") \
        else None
    return alone, spec


def genai_run(model, ids, max_new, sampling=None, **spec_opts) -> tuple[list[int], float]:
    from ortspec.export.genai import genai_greedy
    t0 = time.perf_counter()
    out, _ = genai_greedy(model, ids, max_new, sampling, **spec_opts)
    return out, time.perf_counter() - t0


def llama_cpp_run(bin_dir, target, draft, prompt, max_new, threads, gamma, sampling=None,
                  spec_type="draft-simple") -> tuple[int, float] | None:
    """(tokens decoded, seconds) of one llama.cpp run, from its own counters. With a draft (a GGUF file, or None with
    ``spec_type`` an n-gram type such as "ngram-simple"), the rendered prompt goes to llama-speculative-simple as it
    is; without, the user's prompt goes to llama-cli for one chat turn (it applies the model's chat template itself)
    and only its generation rate is known: the tokens count is then nominal."""
    opts = ["-p", prompt, "-n", str(max_new), "-t", str(threads), "--seed", "0"]
    if sampling:
        opts += ["--temp", str(sampling["temperature"]), "--top-p", str(sampling["top_p"]),
                 "--top-k", str(sampling["top_k"]), "--repeat-penalty", str(sampling["repetition_penalty"])]
    else:
        opts += ["--temp", "0"]
    if draft or spec_type.startswith("ngram"):  # (its prompt goes in one batch: room for a long one)
        opts += ["-b", "8192", "-c", "8192"]
    if spec_type.startswith("ngram"):
        cmd = [str(Path(bin_dir) / "llama-speculative-simple"), "-m", target, *opts, "--spec-type", spec_type]
    elif draft:
        cmd = [str(Path(bin_dir) / "llama-speculative-simple"), "-m", target, "-md", draft, *opts,
               "--spec-type", spec_type, "--spec-draft-n-max", str(gamma)]
    else:
        cmd = [str(Path(bin_dir) / "llama-cli"), "-m", target, *opts, "-st", "--simple-io", "--no-display-prompt"]
    proc = subprocess.run(cmd, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    return parse_llama_cpp(proc.stderr + proc.stdout, max_new)


def ik_llama_cpp_run(bin_dir, target, rendered, max_new, threads, sampling=None, rtr=False) -> tuple[int, float] | None:
    """(tokens decoded, seconds) of one ik_llama.cpp run, from its "eval time" counter. Its llama-cli is the old
    "main": the prompt goes as the chat template renders it (special tokens read as such)."""
    opts = ["-m", target, "-p", rendered, "-n", str(max_new), "-t", str(threads), "--seed", "0",
            "--no-display-prompt", *(["-rtr"] if rtr else [])]
    if sampling:
        opts += ["--temp", str(sampling["temperature"]), "--top-p", str(sampling["top_p"]),
                 "--top-k", str(sampling["top_k"]), "--repeat-penalty", str(sampling["repetition_penalty"])]
    else:
        opts += ["--temp", "0"]
    proc = subprocess.run([str(Path(bin_dir) / "llama-cli"), *opts], capture_output=True, text=True,
                          stdin=subprocess.DEVNULL)
    return parse_ik_llama_cpp(proc.stderr + proc.stdout)


def parse_ik_llama_cpp(log: str) -> tuple[int, float] | None:
    """Decode tokens and seconds from the old "main"'s timings: "eval time = X ms / N runs" (the prompt's line,
    "prompt eval time", is another)."""
    m = re.search(r"(?<!prompt )\beval time\s*=\s*([\d.]+)\s*ms\s*/\s*(\d+)\s*(?:runs|tokens)", log)
    return (int(m.group(2)), float(m.group(1)) / 1e3) if m and int(m.group(2)) else None


class OpenVinoPeer:
    """tools/openvino_peer.py running under another interpreter: one request a line, one answer a line."""

    def __init__(self, python: str, target: str, draft: str | None, threads: int):
        cmd = [python, str(Path(__file__).with_name("openvino_peer.py")), target, "--threads", str(threads)]
        if draft:
            cmd += ["--draft", draft]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        ready = json.loads(self.proc.stdout.readline() or "{}")
        if "ready" not in ready:
            raise RuntimeError(f"openvino_peer.py did not start ({' '.join(cmd)})")
        self.modes = ready["ready"]

    def run(self, mode, prompt, max_new, gamma, sampling=None) -> tuple[int, float, str]:
        self.proc.stdin.write(json.dumps({"mode": mode, "prompt": prompt, "max_new_tokens": max_new,
                                          "gamma": gamma, "sampling": sampling}) + "\n")
        self.proc.stdin.flush()
        out = json.loads(self.proc.stdout.readline())
        return out["tokens"] - 1, out["decode_s"], out["text"]  # (decode-only: the tokens after the first)

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


def parse_llama_cpp(log: str, nominal: int) -> tuple[int, float] | None:
    """Decode tokens and seconds from llama.cpp's log: the speculative tool's "decoded N tokens in S seconds", or
    llama-cli's "[ Prompt: P t/s | Generation: G t/s ]" (``nominal`` tokens at rate G)."""
    m = re.search(r"decoded\s+(\d+)\s+tokens in\s+([\d.]+)\s+seconds", log)
    if m:
        return int(m.group(1)), float(m.group(2))
    m = re.search(r"Generation:\s+([\d.]+)\s+t/s", log)
    return (nominal, nominal / float(m.group(1))) if m and float(m.group(1)) > 0 else None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("bundle")
    ap.add_argument("--prompts", default=str(shipped(DEV_PROMPTS)))
    ap.add_argument("--limit", type=int, default=0, help="use only the first N prompts")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--num-draft-tokens", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out")
    ap.add_argument("--plot")
    ap.add_argument("--peers", default="transformers,genai",
                    help="comma-separated peers to run besides ortspec: transformers, genai (default both)")
    ap.add_argument("--sample", action="store_true",
                    help="every runtime samples (temperature 0.7, top-p 0.8, top-k 20, repetition penalty 1.05)")
    ap.add_argument("--llama-cpp", metavar="BIN_DIR", help="directory with llama-cli and llama-speculative-simple")
    ap.add_argument("--llama-cpp-target", help="the target's GGUF file for llama.cpp")
    ap.add_argument("--llama-cpp-draft", help="the draft's GGUF file for llama.cpp")
    ap.add_argument("--llama-cpp-also", action="append", default=[], metavar="GGUF",
                    help="another GGUF file llama.cpp runs target-only beside --llama-cpp-target (repeatable): a "
                         "re-quantization of the file, to place a peer of a re-quantized bundle's class")
    ap.add_argument("--ik-llama-cpp", metavar="BIN_DIR",
                    help="ik_llama.cpp's binaries: its target-only rows, with and without -rtr, on --llama-cpp-target")
    ap.add_argument("--openvino-python", metavar="PYTHON",
                    help="an interpreter with openvino-genai: OpenVINO GenAI's rows on --llama-cpp-target")
    ap.add_argument("--openvino-draft", metavar="IR_DIR", help="the draft for OpenVINO GenAI (an OpenVINO IR dir)")
    ap.add_argument("--only", metavar="WORDS",
                    help="comma-separated: run only the rows whose name contains one of these words (e.g. "
                         "'target-only' for a speed/fidelity frontier); llama.cpp target-only always runs")
    ap.add_argument("--fidelity", metavar="JSON",
                    help="tools/fidelity.py's report: each ortspec row is shown with its target's top-1 agreement "
                         "and mean KL against the file's float model, each llama.cpp row with its file's")
    args = ap.parse_args()
    if (args.llama_cpp or args.ik_llama_cpp or args.openvino_python) and not args.llama_cpp_target:
        ap.error("--llama-cpp, --ik-llama-cpp and --openvino-python need --llama-cpp-target (the GGUF file; "
                 "--llama-cpp-draft for llama.cpp's speculative run)")
    sampling = SAMPLED if args.sample else None
    peers = {p.strip() for p in args.peers.split(",") if p.strip()}
    unknown = peers - {"transformers", "genai"}
    if unknown:
        ap.error(f"unknown peers {sorted(unknown)}; choose from transformers, genai")

    if "transformers" in peers:
        import torch
    from ortspec import SpeculativeGenerator
    from ortspec.bench import load_prompts
    if "genai" in peers:  # its sessions keep their own threads: create them before the shared pool exists
        alone, paired = genai_models(Path(args.bundle), args.threads, args.num_draft_tokens)
    from ortspec.bundle import load_bundle
    drafter = "model" if load_bundle(args.bundle, verify="none").draft is not None else "none"  # (target-only bundles)
    spec = SpeculativeGenerator.load(args.bundle, threads=args.threads, verify="none", drafter=drafter,
                                     thread_pool="shared")  # as the ortspec commands do
    base, lookup = spec.sibling("none"), spec.sibling("prompt_lookup")
    b = spec.bundle
    eos = sorted(b.eos_token_ids)
    prompts = load_prompts(Path(args.prompts))[: args.limit or None]
    g, new = args.num_draft_tokens, args.max_new_tokens

    mode = dict(do_sample=True, seed=0, **sampling) if sampling else dict(do_sample=False)

    def ours(gen, **kw):
        def run(ids, p, raw):
            for lm in filter(None, (spec.target, getattr(spec.drafter, "lm", None))):
                lm.reset()  # a new request, as for the peers: no prefix cached by the runner before
            r = gen.generate(input_ids=ids, max_new_tokens=new, **mode, **kw)
            if decode_only:  # as llama.cpp's counters: the tokens after the first, in the time after it
                return list(r.token_ids), r.stats.total_time_s - r.stats.first_token_s, len(r.token_ids) - 1
            return list(r.token_ids), r.stats.total_time_s
        return run
    decode_only = bool(args.llama_cpp)
    ref_name, llama_alone = "ortspec target-only", "llama.cpp target-only (decode)"
    runners = {ref_name: ours(base)}
    default_drafter = b.default_drafter or drafter
    if default_drafter != "none":  # the bundle's own decoding: what a call that does not say gets
        default = spec.sibling(default_drafter)
        runners[f"ortspec default ({default_drafter}, {b.default_num_draft_tokens or 4})"] = ours(default)
    if b.draft is not None:
        runners[f"ortspec draft model g={g}"] = ours(spec, num_draft_tokens=g)
        runners["ortspec draft model auto"] = ours(spec, num_draft_tokens="auto")
    runners[f"ortspec prompt-lookup g={g}"] = ours(lookup, num_draft_tokens=g)
    if b.draft is not None:
        hybrid = spec.sibling("hybrid")
        runners[f"ortspec hybrid g={g}"] = ours(hybrid, num_draft_tokens=g)
        runners["ortspec hybrid auto"] = ours(hybrid, num_draft_tokens="auto")
    if "transformers" in peers:
        torch.set_num_threads(args.threads)
        target_hf = load_hf(b.target.source)
        draft_src = b.draft.source if b.draft is not None else None
        assistant = load_hf(draft_src) if draft_src and draft_src.get("kind") != "self" else None
        runners["transformers target-only"] = lambda ids, p, raw: hf_run(target_hf, ids, new, eos, sampling)
        runners[f"transformers prompt-lookup {g}"] = lambda ids, p, raw: hf_run(target_hf, ids, new, eos, sampling,
                                                                           prompt_lookup_num_tokens=g)
        if assistant is not None:
            runners["transformers assisted"] = lambda ids, p, raw: hf_run(target_hf, ids, new, eos, sampling,
                                                                     assistant_model=assistant)
    if "genai" in peers:
        search = dict(sampling, random_seed=0) if sampling else None
        runners["genai target-only"] = lambda ids, p, raw: genai_run(alone, ids, new, search)
        if paired is not None:
            runners[f"genai draft model K={g}"] = lambda ids, p, raw: genai_run(paired, ids, new, search,
                                                                           max_draft_tokens=g)
            runners["genai draft model adaptive K"] = lambda ids, p, raw: genai_run(
                paired, ids, new, search, max_draft_tokens=max(g, 8), min_adaptive_k=1)
        runners[f"genai n-gram K={g}"] = lambda ids, p, raw: genai_run(alone, ids, new, search, max_draft_tokens=g,
                                                                  ngram_size=3)
    if args.llama_cpp:
        runners[llama_alone] = lambda ids, p, raw: llama_cpp_run(
            args.llama_cpp, args.llama_cpp_target, None, raw, new, args.threads, g, sampling)
        if args.llama_cpp_draft:
            runners[f"llama.cpp speculative n={g} (decode)"] = lambda ids, p, raw: llama_cpp_run(
                args.llama_cpp, args.llama_cpp_target, args.llama_cpp_draft, p, new, args.threads, g, sampling)
        for other in args.llama_cpp_also:
            runners[f"llama.cpp target-only {Path(other).stem} (decode)"] = lambda ids, p, raw, f=other: \
                llama_cpp_run(args.llama_cpp, f, None, raw, new, args.threads, g, sampling)
    if args.ik_llama_cpp:
        for rtr in (False, True):
            runners[f"ik_llama.cpp {'-rtr ' if rtr else ''}target-only (decode)"] = \
                lambda ids, p, raw, rtr=rtr: ik_llama_cpp_run(args.ik_llama_cpp, args.llama_cpp_target, p, new,
                                                              args.threads, sampling, rtr)
    openvino = None
    if args.openvino_python:
        openvino = OpenVinoPeer(args.openvino_python, args.llama_cpp_target, args.openvino_draft, args.threads)
        for ov_mode, name in (("target", "target-only"), ("lookup", f"prompt-lookup g={g}"),
                              ("draft", f"draft model g={g}")):
            if ov_mode in openvino.modes:
                runners[f"openvino {name} (decode)"] = lambda ids, p, raw, m=ov_mode: openvino.run(
                    m, raw, new, g, sampling)
    if args.only:
        words = [w.strip() for w in args.only.split(",") if w.strip()]
        runners = {n: r for n, r in runners.items() if n in (ref_name, llama_alone) or any(w in n for w in words)}
    names = list(runners)
    rows = {n: [] for n in names}
    for k, item in enumerate(prompts):
        text = b.tokenizer_file and spec.codec.render_chat(item["prompt"])
        ids = spec.codec.encode(item["prompt"], chat=True)
        for n in names[k % len(names):] + names[: k % len(names)]:
            got = runners[n](ids, text, item["prompt"])
            if got:
                tokens = got[0] if isinstance(got[0], list) else None
                said = got[2] if len(got) > 2 and isinstance(got[2], str) else None  # (OpenVINO: its text)
                count = got[2] if len(got) > 2 and said is None else len(tokens) if tokens is not None else got[0]
                rows[n].append({"prompt": item["id"], "tokens": count, "seconds": got[1],
                                "tokens_per_s": count / got[1], "ids": tokens, "text": said})
        print(f"prompt {k + 1}/{len(prompts)} done", file=sys.stderr, flush=True)
    if openvino is not None:
        openvino.close()
    ref = ref_name
    fidelity = {}
    if args.fidelity:  # the same measure for both sides: tools/fidelity.py, keyed by resolved path
        fidelity = {r["path"]: r for r in json.loads(Path(args.fidelity).read_text())["rows"]}
    sides = {"ortspec": fidelity.get(str(Path(args.bundle).resolve()))}
    if args.llama_cpp_target:
        file = str(Path(args.llama_cpp_target).resolve())
        sides.update({"llama.cpp": fidelity.get(file), "ik_llama.cpp": fidelity.get(file + "#ik"),
                      "ik_llama.cpp -rtr": fidelity.get(file + "#ik-rtr")})
    summary = []
    for n in names:
        if not rows[n]:
            continue
        tps = sum(r["tokens"] for r in rows[n]) / sum(r["seconds"] for r in rows[n])
        ratios = [r["tokens_per_s"] / h["tokens_per_s"] for r, h in zip(rows[n], rows[ref])]
        compared = [(r, h) for r, h in zip(rows[n], rows[ref]) if r["ids"] is not None]  # llama.cpp: no ids
        differ = None if sampling or not compared else sum(r["ids"] != h["ids"][:len(r["ids"])] for r, h in compared)
        said = [(r, h) for r, h in zip(rows[n], rows[ref]) if r.get("text") is not None]  # OpenVINO: its text
        if said and not sampling:
            differ = sum(r["text"].strip() != spec.codec.decode(h["ids"]).strip() for r, h in said)
        summary.append({"runtime": n, "tokens_per_s": tps, "ratio_vs_ortspec_target_only": statistics.median(ratios),
                        "min_ratio": min(ratios), "max_ratio": max(ratios), "runs_with_other_tokens": differ})
        also = next((f for f in args.llama_cpp_also if f" {Path(f).stem} " in n), None)
        side = "ik_llama.cpp -rtr" if n.startswith("ik_llama.cpp -rtr") else n.split(" ")[0]
        fid = fidelity.get(str(Path(also).resolve())) if also else sides.get(side)
        if fid:
            summary[-1]["fidelity"] = {"top1": fid["top1"], "mean_kl": fid["mean_kl"]}
    if rows.get(llama_alone):  # tokens over seconds of all prompts, against llama.cpp's own
        base_tps = next(s["tokens_per_s"] for s in summary if s["runtime"] == llama_alone)
        for s in summary:
            s["ratio_vs_llama_cpp"] = s["tokens_per_s"] / base_tps
    print(f"{'runtime':<40}{'tok/s':>8}{'x ortspec target-only (min-max)':>34}{'other tokens':>14}"
          + (f"{'x llama.cpp':>13}" if rows.get(llama_alone) else "") + (f"{'top-1':>9}{'KL':>9}" if fidelity else ""))
    for s in summary:
        span = f"{s['ratio_vs_ortspec_target_only']:.2f} ({s['min_ratio']:.2f}-{s['max_ratio']:.2f})"
        other = "-" if s["runs_with_other_tokens"] is None else s["runs_with_other_tokens"]
        line = f"{s['runtime']:<40}{s['tokens_per_s']:>8.1f}{span:>34}{other:>14}"
        if "ratio_vs_llama_cpp" in s:
            line += f"{s['ratio_vs_llama_cpp']:>13.2f}"
        if fidelity:
            f = s.get("fidelity")
            line += f"{f['top1'] * 100:>8.1f}%{f['mean_kl']:>9.4f}" if f else f"{'-':>9}{'-':>9}"
        print(line)
    if fidelity:
        print("top-1 / KL: against the file's float model, long windows (tools/fidelity.py, " + args.fidelity + ")")
    kinds = sorted({item.get("kind") for item in prompts} - {None})
    if len(kinds) > 1:  # the median ratio per prompt kind
        kind_of = {item["id"]: item.get("kind") for item in prompts}
        print(f"\n{'median ratio by prompt kind':<40}" + "".join(f"{k:>10}" for k in kinds))
        for s_ in summary:
            n = s_["runtime"]
            by = {k: [r["tokens_per_s"] / h["tokens_per_s"] for r, h in zip(rows[n], rows[ref])
                      if kind_of.get(r["prompt"]) == k] for k in kinds}
            s_["ratio_by_kind"] = {k: statistics.median(v) for k, v in by.items() if v}
            print(f"{n:<40}" + "".join(f"{s_['ratio_by_kind'].get(k, float('nan')):>10.2f}" for k in kinds))
    report = {"bundle": args.bundle, "max_new_tokens": args.max_new_tokens, "prompts": len(prompts),
              "sampling": sampling, "llama_cpp_target": args.llama_cpp_target,
              "llama_cpp_also": args.llama_cpp_also,
              "summary": summary, "per_prompt": rows}
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=2))
    if args.plot:
        from ortspec.figures import versus
        versus({"sampled" if sampling else "greedy": report}, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
