"""Copy the committed admission records (docs/native/<op>-*admission-*.json) whose fingerprint is this
process's into the record cache, for each op that has no record there yet. A device call's tests then
run the admitted native paths without running the gate again: a record counts wherever its fingerprint
(sources, build flags, nvcc, device, driver, CUDA, torch, triton, locked configs) is this process's, so
one taken on the same machine type and software is the same admission.

    RLK_NATIVE_CACHE=DIR python scripts/native_seed_records.py
"""
from pathlib import Path

from rlk_triton import native

DOCS = Path(__file__).resolve().parents[1] / "docs" / "native"


def main() -> int:
    for op in sorted(native.OPS):
        if native.read_record(op) is not None:
            print(f"{op}: a record is already at {native.record_path(op)}")
            continue
        now = native.fingerprint(op, "cuda")
        for path in sorted(DOCS.glob(f"{op}-*admission-*.json"), reverse=True):  # newest date first
            rec = native.read_record(op, path)
            if rec is not None and rec.get("fingerprint") == now:
                print(f"{op}: {path.name} matches this process: copied to {native._write_record(op, rec)}")
                break
        else:
            print(f"{op}: no committed record matches this process (run `rlk-triton native admit --op {op}`)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
