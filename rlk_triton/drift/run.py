"""`rlk-triton drift`: one command, both groups, the table, the JSON and the chart.

    rlk-triton drift [--model PATH] [--prompts FILE] [--new-tokens N] [--seed S] [--device D]
                     [--dtype bf16] [--temperature T] [--json FILE] [--chart FILE.png]

Control group: the transformers model's own batched generate() vs its teacher-forced forwards.
rlk group: rlk_triton.models' rollout engine (paged KV cache in shuffled pages, chunked prefill,
continuous batching with fewer slots than prompts, seeded sampling) vs its packed training path,
on the same weights and prompts. Exit 0 when rlk is bitwise equal on every token (the control
group's numbers are reported whatever they are), 1 when rlk drifts, 2 for a usage error.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--model", help="a local transformers checkpoint directory of a supported family "
                                    "(default: the embedded tiny Qwen3-shaped model, random weights from --seed)")
    ap.add_argument("--preset", default="tiny", choices=("tiny", "gpu"),
                    help="the embedded model's size when --model is not given (gpu: 4 layers, hidden 1024, V 151936)")
    ap.add_argument("--prompts", help="jsonl of {\"ids\": [...]} or {\"text\": ...} (text needs --model's tokenizer)")
    ap.add_argument("--num-prompts", type=int, default=8, help="synthetic prompts when --prompts is not given")
    ap.add_argument("--new-tokens", type=int, default=8, help="tokens sampled per prompt")
    ap.add_argument("--seed", type=int, default=0, help="weights of the embedded model, prompts and sampling")
    ap.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (logp at the same T)")
    ap.add_argument("--dtype", default="bfloat16", help="model dtype: bfloat16 / bf16, float16 / fp16, float32 / fp32")
    ap.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    ap.add_argument("--max-num-seqs", type=int, default=3, help="rlk engine: requests running at once")
    ap.add_argument("--chunk-size", type=int, default=5, help="rlk engine: prefill tokens per request per step")
    ap.add_argument("--json", dest="json_out", metavar="FILE", help="write the full report as JSON")
    ap.add_argument("--chart", metavar="FILE.png", help="write the drift chart (needs matplotlib)")


def _progress(msg: str, t0: float) -> None:
    print(f"[{time.monotonic() - t0:6.1f} s] {msg}", file=sys.stderr, flush=True)


def run_rlk(hf_model, prompts, *, new_tokens: int, temperature: float, seed: int, max_num_seqs: int,
            chunk_size: int, dtype: torch.dtype, device):
    """The rlk group: rollout engine vs training path on the weights of hf_model, probe included."""
    from ..models import RolloutEngine, SamplingParams, from_hf_model, to_training_batch, train_forward
    from ..probe import Recording, compare
    from .report import measure_group

    model = from_hf_model(hf_model, dtype=dtype, device=device)
    rollout_rec, train_rec = Recording("rlk rollout"), Recording("rlk training")
    engine = RolloutEngine(model, max_num_seqs=max_num_seqs, chunk_size=chunk_size, page_seed=seed)
    results = engine.generate(prompts, SamplingParams(temperature=temperature, seed=seed), max_new_tokens=new_tokens,
                              record=rollout_rec.record)
    tokens, cu_seqlens, rows = to_training_batch(results, device=device)
    with torch.no_grad():
        train_all = train_forward(model, tokens, cu_seqlens, temperature=temperature, record=train_rec.record,
                                  seq_ids=[r.request_id for r in results])
    rollout_logp = torch.cat([r.logp for r in results]).float()
    train_logp = train_all.index_select(0, rows).float().cpu()
    # key = (request, position of the sampled token), as the control group keys its tokens
    keys = torch.tensor([[r.request_id, len(r.prompt) + j] for r in results for j in range(len(r.tokens))],
                        dtype=torch.int64)
    probe = compare(rollout_rec, train_rec)
    return measure_group("rlk", rollout_logp, train_logp, keys, dtype=dtype, probe=probe), engine.steps


def main(args: argparse.Namespace) -> int:
    from ..errors import InputError
    from .control import run_control
    from .report import build_report, control_group, describe_model, device_name, format_table
    from .tiny import load_model, load_prompts, resolve_dtype, synthetic_prompts, tiny_model

    t0 = time.monotonic()
    for name in ("new_tokens", "num_prompts", "max_num_seqs", "chunk_size"):
        if getattr(args, name) < 1:
            raise InputError(f"--{name.replace('_', '-')}", f"must be >= 1, got {getattr(args, name)}")
    dtype = resolve_dtype(args.dtype, "--dtype")
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda" and not torch.cuda.is_available():
        raise InputError("--device", "cuda requested but this torch has no CUDA device")
    if args.model:
        _progress(f"loading {args.model}", t0)
        hf_model = load_model(args.model, dtype=dtype, device=device)
    else:
        hf_model = tiny_model(seed=args.seed, dtype=dtype, preset=args.preset, device=device)
    if args.prompts:
        prompts = load_prompts(args.prompts, tokenizer_dir=args.model)
    else:
        prompts = synthetic_prompts(seed=args.seed, vocab_size=hf_model.config.vocab_size, n=args.num_prompts)
    model_info = describe_model(hf_model, args.model or f"embedded {args.preset} Qwen3 (random weights, seed {args.seed})")
    _progress(f"model {model_info['name']}: {model_info['layers']} layers, hidden {model_info['hidden']}, "
              f"vocab {model_info['vocab']}; {len(prompts)} prompts x {args.new_tokens} new tokens on {device}", t0)

    _progress("control group: transformers generate() and teacher-forced forwards", t0)
    control = control_group(run_control(hf_model, prompts, max_new_tokens=args.new_tokens,
                                        temperature=args.temperature, seed=args.seed, probe=True))
    _progress("rlk group: rollout engine (paged KV, chunked prefill, continuous batching) and training path", t0)
    rlk, steps = run_rlk(hf_model, prompts, new_tokens=args.new_tokens, temperature=args.temperature, seed=args.seed,
                         max_num_seqs=args.max_num_seqs, chunk_size=args.chunk_size, dtype=dtype, device=device)
    report = build_report(control=control, rlk=rlk, model=model_info, device=device_name(device), dtype=dtype,
                          seed=args.seed,
                          settings={"temperature": args.temperature, "max_new_tokens": args.new_tokens,
                                    "prompts": len(prompts), "rlk_max_num_seqs": args.max_num_seqs,
                                    "rlk_chunk_size": args.chunk_size, "rlk_engine_steps": steps})
    print(format_table(report))
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(report, indent=1, allow_nan=False) + "\n")
        _progress(f"wrote {args.json_out}", t0)
    if args.chart:
        from .chart import write_chart

        write_chart(args.chart, report, control, rlk)
        _progress(f"wrote {args.chart}", t0)
    verdict = ("rlk: every token's rollout logp equals its training logp, bitwise"
               if rlk.bitwise else f"rlk DRIFTS: first divergent op {report['rlk']['first_divergent_op']}")
    print(f"{verdict} ({rlk.report.active} tokens); control max |dlogp| {report['control']['max_abs_dlogp']:.3g}")
    return 0 if rlk.bitwise else 1
