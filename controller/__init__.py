"""fracgpu controller: records each claim's physical GPU and keeps the GPU ledger (kopf)."""
