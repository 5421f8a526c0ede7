"""K/V memory: every cache of keys and values a model reads and writes, behind the interfaces
models call (models know nothing of who stores what). Shapes: k, v (B, H_kv, q, D), already
rotated at their positions.

- `update(layer, k, v, start) -> (keys, values)` (layers/attention.py KVBuffer): a forward's fresh
  K/V for canvas columns [start, start + q); returns the keys and values to attend over
  (B, H_kv, length, D). rows.py RowsKV (the engine's rows, each in its slot of the rows' store,
  each at its own columns), rows.py Recorder (keeps the fresh K/V, caches nothing: diagnostics),
  static.py StaticKV (one canvas-wide buffer per layer: the reference loops).
- `extend(layer, k, v, context) -> (keys, values)` (the DFlash drafter): k, v cover `context` new
  context positions, then the block; the new context is kept. rows.py DraftKV (the engine's
  speculative rows, in slots), draft.py DraftCache (the one-request loop).
- `encoder_keys` / `denoiser_keys` (a renoising model): renoise.py RenoiseKV, the encoder's slots
  per row (held and valid), sliding-window layers holding the last window - 1; the engine's
  instance keeps them in a store with free rows and columns (joins and departures copy no other
  row).
The engine's memory is one slot store, slots.py SlotStore (a join takes a slot, a departure moves the
last row into it, the last one leaving frees it): the masked and speculative rows' K/V and drafter
context (engine/rows.py `Rows`), the renoising encoder's slots (RenoiseKV) and the prefix cache's
page pool (prefix.py PrefixStore, which also keeps the one prefix-sharing lifecycle every row kind
uses). Cache policies (unmask.cache) decide what to recompute and own no memory.
"""

from unmask.kv.draft import DraftCache
from unmask.kv.renoise import RenoiseKV
from unmask.kv.rows import DraftKV, Recorder, RowsKV
from unmask.kv.static import StaticKV

__all__ = ["DraftCache", "DraftKV", "Recorder", "RenoiseKV", "RowsKV", "StaticKV"]
