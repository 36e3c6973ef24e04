"""Round 28, MoE skills (long context, optimization workflow): mistake classes the blind
batches showed the grader missing, and good answers it failed, tested in sentences of our own."""

from __future__ import annotations

import pytest
from test_claims import LONG, WORKFLOW, found


@pytest.mark.parametrize("skill", [LONG, WORKFLOW])
def test_a_config_line_that_switches_layer_offload_on_is_advice(skill: str) -> None:
    on = ("Layout: TP=2 PP=4 EP=8.\n\n```python\nrecipe.model.cpu_offloading = True\n"
          "recipe.model.cpu_offloading_num_layers = 3\n```\n")
    assert "cpu-offload-at-pp-gt-1" in found(skill, on)
    off = ("Layout: TP=2 PP=4 EP=8.\n\n```python\nrecipe.model.cpu_offloading = False\n"
           "recipe.optimizer.optimizer_cpu_offload = True\n```\n")
    assert "cpu-offload-at-pp-gt-1" not in found(skill, off)
