"""`rlk-triton drift`: rollout vs training log-probs of one fixed model, prompt set and seed.

Two groups side by side: the **control** group runs stock transformers kernels (`control`: batched,
left-padded `generate()` with a KV cache against teacher-forced forwards), where the log-probs drift;
the **rlk** group runs rlk_triton's rollout engine against its training path, where they are expected
bitwise equal. `report` builds the audit metrics and the JSON, `chart` the PNG, `tiny` the embedded
default model and prompts; the layer-wise probe is `rlk_triton.probe`. See docs/drift.md.
"""
