"""Data package: the contract tables (*.yaml) and their schema (SCHEMA.md). Loaded by rlk_triton.contracts."""
