"""Rollout and training throughput of rlk_triton.models against transformers, same run, same weights.

    python scripts/gpu_model_speed.py [--preset gpu] [--prompts 8] [--new-tokens 48] [--out speed.json]

Rollout: rlk's RolloutEngine (paged KV, continuous batching, all prompts running at once) against
transformers' generate() (KV cache, one left-padded batch, its default attention), sampling at T = 1,
the same prompts and number of new tokens: generated tokens per second, wall clock, after one warm-up.
Training: packed prompt + completion tokens, forward + backward of the summed per-token logp: rlk's
train_forward (linear_logp, no logits) against transformers' padded forward + log_softmax + gather.
"""
import argparse
import json

import torch

from rlk_triton import bench


def _timed(fn, repeat):
    """Seconds per call (one warm-up call)."""
    return bench.wall_ms(fn, repeat, warmup=1) / 1e3


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="gpu")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--new-tokens", type=int, default=48)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--out")
    args = ap.parse_args()
    from rlk_triton.drift.tiny import synthetic_prompts, tiny_model
    from rlk_triton.models import RolloutEngine, SamplingParams, from_hf_model, to_training_batch, train_forward

    dev = torch.device("cuda")
    hf = tiny_model(seed=0, dtype="bfloat16", preset=args.preset, device=dev)
    prompts = synthetic_prompts(seed=0, vocab_size=hf.config.vocab_size, n=args.prompts, min_len=16, max_len=64)
    model = from_hf_model(hf, dtype=torch.bfloat16, device=dev)
    n_new = args.prompts * args.new_tokens

    def rlk_rollout():
        eng = RolloutEngine(model, max_num_seqs=args.prompts, chunk_size=256, page_seed=0)
        return eng.generate(prompts, SamplingParams(temperature=1.0, seed=0), max_new_tokens=args.new_tokens)

    L = max(map(len, prompts))
    ids = torch.zeros((len(prompts), L), dtype=torch.long, device=dev)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, L - len(p):] = torch.tensor(p, device=dev)
        mask[i, L - len(p):] = 1

    def hf_rollout():
        with torch.no_grad():
            return hf.generate(input_ids=ids, attention_mask=mask, do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                               max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens, pad_token_id=0)

    results = rlk_rollout()
    tokens, cu, rows = to_training_batch(results, device=dev)
    n_train = int(tokens.numel())
    for p in model.parameters():
        p.requires_grad_(True)

    def rlk_train():
        model.zero_grad(set_to_none=True)
        train_forward(model, tokens, cu).sum().backward()

    seqs = [tokens[int(cu[i]):int(cu[i + 1])] for i in range(len(results))]
    T = max(len(s) for s in seqs)
    pad = torch.zeros((len(seqs), T), dtype=torch.long, device=dev)
    am = torch.zeros_like(pad)
    for i, s in enumerate(seqs):
        pad[i, :len(s)] = s
        am[i, :len(s)] = 1
    hf.train()

    def hf_train():
        hf.zero_grad(set_to_none=True)
        logits = hf(input_ids=pad, attention_mask=am).logits[:, :-1].float()
        lp = torch.log_softmax(logits, -1).gather(-1, pad[:, 1:, None]).squeeze(-1)
        (lp * am[:, 1:]).sum().backward()

    rows_out = []
    for name, fn, count in (("rollout rlk RolloutEngine", rlk_rollout, n_new),
                            ("rollout transformers generate", hf_rollout, n_new),
                            ("training fwd+bwd rlk train_forward", rlk_train, n_train),
                            ("training fwd+bwd transformers", hf_train, n_train)):
        s = _timed(fn, args.repeat)
        rows_out.append({"what": name, "seconds": s, "tokens": count, "tokens_per_s": count / s})
        print(f"{name}: {s * 1e3:.1f} ms, {count / s:.0f} tokens/s", flush=True)
    report = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
              "attn_implementation": getattr(hf.config, "_attn_implementation", None), "preset": args.preset,
              "prompts": args.prompts, "new_tokens": args.new_tokens, "rows": rows_out,
              "ratios": {"rollout rlk / transformers": rows_out[0]["tokens_per_s"] / rows_out[1]["tokens_per_s"],
                         "training rlk / transformers": rows_out[2]["tokens_per_s"] / rows_out[3]["tokens_per_s"]}}
    print(json.dumps(report["ratios"]))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
