"""Round 32, from blind batches 15 and 16 (written blind this stop, measured once at ff45e76:
22/32 and 24/32): negation read where good answers deny a claim (Japanese ではない and
とは限りません, "none of", "raises a ValueError", a label's verdict after its colon, a dash
that ends the negation's reach), context that spares a claim (DP > 1 stated with the
sharding), a harness list flag split by a space, and claims in other words. Sentences of our
own, each with a near miss."""

from __future__ import annotations

from test_claims import LONG, MEMORY, RECOMPUTE, WORKFLOW, found

from mbridge_perf.evals.answer import parse_answer
from mbridge_perf.evals.keys import invented_keys


def test_japanese_denials_negate_the_claim() -> None:
    assert "vpp-cleared-the-oom" not in found(
        MEMORY, "いいえ、OOM が解消したのは VPP を上げたからではないと考えてください。")
    assert "uniform-one-always-lowest" not in found(
        RECOMPUTE, "uniform で N=1 が常に最小とは限りません。N=1, 2, 4 を見積もってください。")


def test_none_of_and_a_raised_error_negate() -> None:
    assert "cpu-offload-first" not in found(
        MEMORY, "- Layer offloading: at PP = 8 the cpu_offloading flag raises a ValueError.\n")
    text = ("The overlap run adds 4 % on top, and none of that extra comes from EP overlap "
            "alone.")
    assert not [m for m in found(WORKFLOW, text) if "credit" in m]


def test_a_dash_ends_the_reach_of_not() -> None:
    text = "Not so fast — the log shows fragmentation, not missing activation space."
    assert "fragmentation-ruled-out-blindly" not in found(MEMORY, text)


def test_sharding_over_dp2_stated_spares_the_dp1_claim() -> None:
    text = ("Layout TP4 PP4 DP2; the PP8 variant would be DP1.\n\n"
            "`cfg.optimizer.use_distributed_optimizer = True` shards the optimizer state over "
            "the DP ranks (DP=2 here).\n")
    assert "distributed-optimizer-at-dp1" not in found(MEMORY, text)


def test_a_space_separated_harness_list_is_flagged() -> None:
    bad = "```bash\npython setup_experiment.py --recompute_modules moe_act layernorm\n```\n"
    assert [b.what for b in invented_keys(parse_answer(bad).units)]
    good = "```bash\npython setup_experiment.py --recompute_modules moe_act,layernorm\n```\n"
    assert invented_keys(parse_answer(good).units) == []
    prose = "The --recompute_modules flag takes a comma-separated list.\n"
    assert invented_keys(parse_answer(prose).units) == []


def test_graph_register_left_unset_on_gb200() -> None:
    bad = ("```bash\n# with TE graphs: NCCL_GRAPH_REGISTER=0\n"
           "# on GB200 you can leave it unset\n```\n")
    assert "graph-register-not-needed-on-blackwell" in found(MEMORY, bad)


def test_offload_fraction_said_to_offload_everything_by_default() -> None:
    bad = "optimizer_offload_fraction defaults to offloading the whole state; nothing else to set."
    assert "offload-fraction-default-all" in found(LONG, bad)


def test_keeping_recompute_on_while_offloading() -> None:
    bad = "At PP=1 offloading is allowed, and you can keep layernorm recompute on while offloading."
    assert "cpu-offload-with-recompute" in found(RECOMPUTE, bad)
    near = "At PP=1 offloading is allowed, but it cannot run with layernorm recompute on."
    assert "cpu-offload-with-recompute" not in found(RECOMPUTE, near)


def test_a_fix_declared_after_iteration_one() -> None:
    bad = "Iteration 1 finishes without an OOM, so mark the fix as fixed there."
    assert "peak-from-iteration-1" in found(RECOMPUTE, bad)
    near = "It OOMs at iteration 1, so the peak there says nothing; read iteration 2."
    assert "peak-from-iteration-1" not in found(RECOMPUTE, near)
