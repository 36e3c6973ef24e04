"""Round 30, from blind batch 13 (measured at 20/32 before any change for it; 19/32 at the
start of the stop): where a step stands in a plan - a numbered step head that puts a later
item first, a condition that names a step without taking it, "frees roughly 0", a set-first
cue before a parenthesis, a "Leave as is" list, a Japanese report of earlier results - and the
review readings (a closing "— blocking" verdict, 🔴), a config path through the recipe object,
and claims the cards missed (windows ending before 41, max_steps under 50, packed batches said
to be fine for graphs, "空き GPU"). Sentences of our own, each with a near miss."""

from __future__ import annotations

from test_claims import LONG, MEMORY, RECOMPUTE, found, order_ok

from mbridge_perf.evals.answer import parse_answer
from mbridge_perf.evals.keys import invented_keys


def test_a_step_head_that_puts_recompute_first_breaks_the_order() -> None:
    bad = ("1. **Start with selective recompute.** `recompute_modules=[\"layernorm\"]`.\n"
           "2. **Next, the allocator.** `export PYTORCH_CUDA_ALLOC_CONF="
           "expandable_segments:True`.\n"
           "3. **Full recompute only if selective cannot fit**, with `recompute_method` and "
           "`recompute_num_layers` set.\n")
    assert not order_ok(RECOMPUTE, bad)
    good = ("1. **Allocator first.** `export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`."
            "\n2. **Then selective recompute.** `recompute_modules=[\"layernorm\"]`.\n")
    assert order_ok(RECOMPUTE, good)


def test_a_condition_names_a_step_without_taking_it() -> None:
    text = ("1. Set `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`.\n"
            "2. Use `recompute_modules=[\"layernorm\"]`; add `mlp` if still short.\n"
            "3. Only if selective recompute cannot fit, go to `recompute_granularity=\"full\"` "
            "with `recompute_method` and `recompute_num_layers`.\n")
    assert order_ok(RECOMPUTE, text)


def test_frees_roughly_zero_is_no_advice_to_recompute_core_attn() -> None:
    text = ("With fused attention, checkpointing `core_attn` frees roughly 0.\n\n"
            "1. Check `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True` is exported.\n"
            "2. Use `recompute_modules=[\"layernorm\"]`.\n")
    assert order_ok(RECOMPUTE, text)


def test_set_first_before_a_parenthesis_puts_the_step_first() -> None:
    text = ("Use `recompute_modules=[\"layernorm\"]` for the remaining gap. If it was a "
            "borderline OOM, set `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True` first (and "
            "`NCCL_GRAPH_REGISTER=0` with TE graphs).\n")
    assert order_ok(RECOMPUTE, text)


def test_a_leave_as_is_list_places_no_step() -> None:
    text = ("**Change:** add `optimizer.optimizer_cpu_offload=True` with "
            "`optimizer_offload_fraction=0.5`.\n\n**Leave as is**\n"
            "- CP 16 for 64K (65536 / 4096), flex with `moe_flex_dispatcher_backend=hybridep`.\n")
    units = parse_answer(text).units
    assert units[-1].kept and not units[0].kept
    assert order_ok(LONG, text)


def test_a_japanese_report_of_earlier_results_places_no_step() -> None:
    text = ("これまでの実測（BF16、HybridEP）では 32K で約 135 GB/GPU でした。\n\n"
            "128K では CP = 131072 / 4096 = 32 を目安にしてください。\n")
    assert order_ok(LONG, text)


def test_a_closing_blocking_verdict_rejects_the_quoted_line() -> None:
    text = "**`recompute_modules: [attn_proj, layernorm]`** — blocking.\n"
    assert invented_keys(parse_answer(text).units) == []
    assert invented_keys(parse_answer("Set `recompute_modules: [attn_proj, layernorm]`.\n").units)


def test_a_recipe_objects_config_path_is_checked_for_invented_fields() -> None:
    bad = "```python\ncfg.model.recompute_attention_only = True\n```\n"
    assert [b.what for b in invented_keys(parse_answer(bad).units)]
    good = "```python\ncfg.model.recompute_granularity = \"selective\"\n```\n"
    assert invented_keys(parse_answer(good).units) == []


def test_throughput_read_on_an_early_window_or_a_short_run() -> None:
    for bad in ("Average the TFLOP/s over iterations 21-30 and compare it with the golden.",
                "A quick run is enough for the throughput gate: `--max_steps 30`."):
        assert "throughput-window-from-iteration-1" in found(RECOMPUTE, bad), bad
    near = "Run 50 steps and compare the TFLOP/s over iterations 41-50 with the golden."
    assert "throughput-window-from-iteration-1" not in found(RECOMPUTE, near)


def test_packed_batches_said_to_be_fine_for_graphs() -> None:
    bad = "Variable-length packed batches are fine with the TE graphs, so keep them on."
    assert "graphs-with-variable-shapes" in found(LONG, bad)
    near = "Variable-length packed batches need eager mode: graphs want fixed shapes."
    assert "graphs-with-variable-shapes" not in found(LONG, near)


def test_spare_gpus_in_japanese_are_not_freed_memory() -> None:
    text = "PP を上げるのは空き GPU で DP を保てる場合だけです（FP8 の実測で -5.9 %）。"
    assert "fp8-saves-memory" not in found(MEMORY, text)
    assert "fp8-saves-memory" in found(MEMORY, "FP8 にすればメモリが数 GB 空きます。")
