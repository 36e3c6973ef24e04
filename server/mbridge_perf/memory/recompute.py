"""Full (whole-layer) recompute as Megatron-Core runs it: what a micro-batch keeps between its
forward and its backward, and how many layers one backward rebuilds on top of that.

Megatron-Core checkpoints per model chunk (``TransformerBlock._checkpointed_forward``; one block
per pipeline rank and virtual chunk, ``len(self.layers)`` layers):

- ``uniform``, N: the chunk's layers are cut into consecutive groups of N, each one checkpoint
  that keeps only its input: ``ceil(L_chunk / N)`` inputs per micro-batch. In backward a whole
  group is re-run with grad before backprop goes through it, so the working set holds the full
  activations of N layers at once (megatron-core 0.19 clamps the last group; 0.16 requires N to
  fit in the chunk): ``min(N, L_chunk)`` layers.
- ``block``, N: the first N layers of the chunk are checkpointed one by one, the other
  ``L_chunk - N`` keep full activations. Backward reaches the checkpointed layers last, after
  the kept layers of the same micro-batch have released theirs, so re-running one layer needs
  no more than was just freed. Only a chunk that is checkpointed whole (N >= L_chunk) adds one
  layer's activations to its backward.

With several micro-batches in flight (pipeline schedules) each keeps its stored part; the
rebuilt layers belong to the one micro-batch in backward. The peak of a stage is therefore

    in-flight x (checkpoint inputs + kept layers) + rebuilt layers + one layer's backward,

so ``uniform`` N = 1 keeps the least per micro-batch but N > 1 wins once the inputs it saves
(in-flight x ceil(L/N) fewer) outweigh N - 1 more rebuilt layers.

Measured on real Megatron-Core on CPU (tests/memory/test_recompute_mcore.py): the rebuilt part
is N x one layer's activations for ``uniform`` and nothing for ``block`` with a kept layer.
"""

from __future__ import annotations

from mbridge_perf.config.model import ModelSection
from mbridge_perf.memory.placement import placement


def rebuilt_layers(m: ModelSection, method: str | None, n: int) -> int:
    """Layers' worth of full activations one backward rebuilds beyond what its micro-batch
    still holds (0 without full recompute). ``uniform``: the largest group, ``min(N, L)`` over
    the chunks; ``block``: 1 when some chunk is checkpointed whole (N >= its layers), else 0.
    Taken over all chunks of the model: a stage whose chunks differ is priced by the largest."""
    if method is None or n < 1:
        return 0
    sizes = [ch.num_layers for rank in placement(m) for ch in rank if ch.num_layers]
    if not sizes:
        return 0
    if method == "block":
        return 1 if n >= min(sizes) else 0
    return min(n, max(sizes))

