"""The coursework's assignments: which whole functions each chapter of the course hands out, the
project's tests that grade them, the written deliverable (a measurement with tinyspec's own
commands, explained by the walkthrough's cost model) and the hours it takes. `course.py` hands
them out and grades them; the walkthrough's coursework table is `chapters_table()`.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Chapter:
    walkthrough: str  # the walkthrough chapter that teaches it: its "## N Title", without the "## "
    functions: tuple[str, ...]  # "file.py:function" or "file.py:Class.method", relative to tinyspec/
    tests: tuple[str, ...]  # pytest node ids of the tests that grade it (one score point each)
    needs: tuple[str, ...] = ()  # chapters whose code these tests run too
    hours: int = 0  # what a student needs, the written deliverable included
    deliverable: str = ""  # a measurement made with a tinyspec command, and what to explain by it
    extra: str = ""  # the optional package its tests import, installed as the extra of its name (".[triton]")
    notes: str = ""  # what the tests hold a solution to beyond the docstrings: types, errors, edge cases


CHAPTERS = {
    "tokenizer": Chapter(
        "1 Tokenizer", ("tokenizer.py:train_bpe",),
        ("tests/test_tokenizer.py::test_merges_equal_tiktoken_reference_trainer",
         "tests/test_tokenizer.py::test_merges_equal_reference_on_random_texts_full_of_ties",
         "tests/test_tokenizer.py::test_training_counts_chunks_not_positions",
         "tests/test_tokenizer.py::test_save_load_roundtrip",
         "tests/test_tokenizer.py::test_encoding_uses_training_merges"),
        hours=8,
        deliverable="A table of your trainer's seconds against the vocabulary size: run "
                    "`time python -m tinyspec train tokenizer --vocab-size 1024 --out runs/tok1024/tokenizer.tiktoken` "
                    "and again with 2048, 4096 and 8192. Explain the growth by the cost of one merge (the chunk "
                    "counts it updates, not the corpus's positions) and say, with chapter 2's cost of the LM head "
                    "(V x C multiply-adds per token), what a larger vocabulary costs every forward and what it "
                    "saves (fewer tokens, so fewer forwards, per text)."),
    "model": Chapter(
        "2 Model", ("model.py:causal_mask", "model.py:prefix_mask", "model.py:CausalSelfAttention.forward",
                    "model.py:GPT.hidden"),
        ("tests/test_model.py::test_logits_match_huggingface_gpt2",
         "tests/test_model.py::test_explicit_positions_match_huggingface_position_ids",
         "tests/test_model.py::test_roundtrip_through_huggingface",
         "tests/test_model.py::test_tree_mask_and_positions_equal_separate_sequences"),
        hours=6,
        deliverable="Plain decoding's speed on your CPU with one and with two threads: "
                    "`python -m tinyspec bench --methods ar --temperatures 0 --max-new-tokens 64 --threads 1 --json` "
                    "(then `--threads 2`). Tabulate tokens/s and explain it by the roofline of chapter 2: the bytes "
                    "of weights a one-token forward reads against the FLOPs it does (its arithmetic intensity), and "
                    "whether your CPU's memory bandwidth or its arithmetic bounds a step."),
    "kvcache": Chapter(
        "3 KV cache", ("kvcache.py:KVCache.truncate", "kvcache.py:KVCache.keep"),
        ("tests/test_kvcache.py::test_truncate_then_redecode_equals_fresh_cache",
         "tests/test_kvcache.py::test_keep_compacts_an_accepted_tree_path",
         "tests/test_kvcache.py::test_keep_rejects_unsorted_or_stale_slots",
         "tests/test_speculative.py::test_caches_after_speculative_steps_equal_plain_decoding"),
        needs=("model", "sampling", "speculative"), hours=5,
        deliverable="Tokens/s of plain decoding against the length it generates: "
                    "`python -m tinyspec bench --methods ar --temperatures 0 --max-new-tokens 32 --json`, then 64, "
                    "128 and 256. Explain the (near) flat cost per token by what the cache saves (a step reads L "
                    "cached keys instead of recomputing L tokens' layers) and the slow growth left by the attention "
                    "over L keys; estimate the cache's bytes per token (2 x layers x C floats)."),
    "sampling": Chapter(
        "4 Sampling", ("sampling.py:probs", "sampling.py:sample"),
        ("tests/test_sampling.py::test_matches_huggingface_warpers",
         "tests/test_sampling.py::test_greedy_is_one_hot_at_argmax",
         "tests/test_sampling.py::test_top_p_keeps_smallest_set_reaching_mass",
         "tests/test_sampling.py::test_top_p_keeps_the_set_whose_mass_is_exactly_p_and_no_more",
         "tests/test_sampling.py::test_seeded_sampling_is_reproducible_and_follows_p",
         "tests/test_sampling.py::test_zero_probability_tokens_are_never_drawn_and_one_hot_gives_its_token"),
        hours=4,
        deliverable="Plain decoding at temperatures 0, 0.7 and 1: "
                    "`python -m tinyspec bench --methods ar --temperatures 0,0.7,1 --json`. Tabulate tokens/s per "
                    "temperature and explain, from the cost of a step (one forward, then a softmax and a draw over "
                    "V), why sampling costs (nearly) the same as greedy decoding; say where the time of a step goes."),
    "speculative": Chapter(
        "5 Speculative sampling", ("methods/draft.py:accept_or_resample",),
        ("tests/test_speculative.py::test_greedy_equals_plain_decoding_for_every_k_and_draft",
         "tests/test_speculative.py::test_acceptance_rule_reproduces_p_for_fixed_distributions",
         "tests/test_speculative.py::test_sampled_output_has_the_target_distribution",
         "tests/test_speculative.py::test_a_k_chosen_anew_every_step_is_still_exact"),
        needs=("model", "kvcache", "sampling"), hours=8,
        deliverable="tau and speedup of a draft model against k at T = 0 and T = 1: "
                    "`python -m tinyspec bench --methods ar,draft:1,draft:2,draft:4,draft:8 --temperatures 0,1 "
                    "--json`. Plot (or tabulate) tau and the speedup against k; explain the best k by chapter 5's "
                    "cost model, speedup = tau / (F(k + 1) + k c), with c the draft's step in target steps, and "
                    "compare the measured tau with the expected (1 - alpha^(k+1)) / (1 - alpha)."),
    "tree": Chapter(
        "6 Trees", ("tree.py:depths", "tree.py:tree_mask", "tree.py:root_to_leaf_paths"),
        ("tests/test_tree.py::test_hand_drawn_tree", "tests/test_tree.py::test_chain_and_star",
         "tests/test_tree.py::test_choice_lists_round_trip",
         "tests/test_tree.py::test_tree_from_accuracies_takes_the_most_likely_nodes"),
        hours=4,
        deliverable="tau and speedup against a tree's size: "
                    "`python -m tinyspec bench --methods ar,medusa:4,medusa:8,medusa:16,medusa:32 --temperatures 0 "
                    "--json`. Explain why tau grows ever more slowly with the nodes (each added node is the next "
                    "likeliest path) while the forward over 1 + T tokens costs F(1 + T), and where the two cross "
                    "on your CPU."),
    "verify": Chapter(
        "6 Trees", ("verify.py:longest_accepted_path", "verify.py:greedy"),
        ("tests/test_medusa.py::test_greedy_medusa_equals_plain_decoding_on_every_tree_shape",
         "tests/test_medusa.py::test_trained_heads_make_greedy_medusa_take_fewer_target_passes",
         "tests/test_medusa.py::test_cache_after_medusa_steps_equals_plain_decoding",
         "tests/test_lookup.py::test_greedy_lookup_equals_plain_decoding"),
        needs=("model", "kvcache", "sampling", "tree", "medusa", "lookup"), hours=3,
        deliverable="Where a greedy step's time goes: "
                    "`python -m tinyspec bench --methods ar,medusa:16 --temperatures 0 --profile --json`. Tabulate "
                    "the split (the target's forward, proposing, the rule, cache work) and explain by the cost model "
                    "why the rule, which reads T + 1 rows already computed, must stay a small share of a step."),
    "rules": Chapter(
        "7 Exact rules",
        ("verify.py:_walk", "verify.py:lossless", "verify.py:pointmass", "verify.py:block", "verify.py:traversal"),
        ("tests/test_verify.py::test_chain_rules_reproduce_the_target_two_token_distribution",
         "tests/test_verify.py::test_traversal_is_block_verification_on_a_chain",
         "tests/test_verify.py::test_block_refuses_a_branching_tree",
         "tests/test_verify.py::test_block_verification_accepts_more_on_the_papers_example",
         "tests/test_block_correction.py::test_block_has_the_target_distribution_where_the_correction_is_weighed",
         "tests/test_verify.py::test_lossless_tree_sampling_has_the_target_distribution",
         "tests/test_verify.py::test_pointmass_rule_makes_the_top_k_tree_lossless",
         "tests/test_verify.py::test_traversal_verification_of_a_sampled_tree_has_the_target_distribution"),
        needs=("model", "kvcache", "sampling", "tree", "speculative", "medusa"), hours=12,
        notes="Every rule returns (path, next_token): path a 1-D long tensor of node indices from the root, "
              "path[0] == 0, and next_token a 0-d tensor (what `sample` gives for one row). `block` judges a chain "
              "only: given a branching tree it raises ValueError, its message naming a chain (the tests match "
              "\"chain\"). In `traversal` a rejected child can leave its parent nothing, S = 0: keep the parent's "
              "P_b as it was, and its weight becomes S / (S + 1 - p_b) = 0 (keep 1 if p_b was 1 too, 0 / 0, a "
              "rejection of probability 0 that only rounding reaches). Do not divide R by S there: 0 / 0 is NaN, "
              "and Python's min(1.0, nan) is 1.0, so every child below would pass. `sampling.residual(w * P_b, q)` "
              "returns P_b itself when the mass is 0.",
        deliverable="tau of each lossless rule at T = 1 on the same prompts: "
                    "`python -m tinyspec bench --methods ar,draft:4,draft:4@block,draft:4@traversal,medusa@pointmass,"
                    "eagle@lossless,eagle@traversal --temperatures 1 --json`. Tabulate tau and tokens/s per rule and "
                    "explain: every rule pays the same forward, so the speedup follows tau; why block and traversal "
                    "verification accept at least as much as the token-by-token walk, and why pointmass, not "
                    "lossless, is the rule for a top-k tree."),
    "medusa": Chapter(
        "8 Medusa", ("methods/medusa.py:propose",),
        ("tests/test_medusa.py::test_greedy_medusa_equals_plain_decoding_on_every_tree_shape",
         "tests/test_medusa.py::test_lossless_rules_at_temperature_zero_are_greedy_decoding",
         "tests/test_medusa.py::test_cache_after_medusa_steps_equals_plain_decoding",
         "tests/test_medusa.py::test_trained_heads_make_greedy_medusa_take_fewer_target_passes"),
        needs=("model", "kvcache", "sampling", "tree", "verify", "rules"), hours=4,
        deliverable="Medusa at fixed sizes and sized for your CPU: "
                    "`python -m tinyspec bench --methods ar,medusa:4,medusa:16,medusa:64,medusa:auto --temperatures 0 "
                    "--json`. Tabulate tau, tokens/s and speedup; explain why the heads cost almost nothing to run "
                    "(a ResBlock and the LM head on one feature) and what --size auto chose, by the cost model "
                    "(tau against F(1 + T))."),
    "eagle": Chapter(
        "9 EAGLE: drafting features, growing the tree", ("methods/growth.py:grow_tree",),
        ("tests/test_eagle.py::test_grow_tree_on_the_docstring_example",
         "tests/test_eagle.py::test_grow_tree_matches_a_plain_reference",
         "tests/test_eagle.py::test_greedy_eagle_equals_plain_decoding",
         "tests/test_eagle.py::test_caches_after_eagle_steps_equal_plain_decoding"),
        needs=("model", "kvcache", "sampling", "tree", "verify", "rules", "sampled_tree", "training"), hours=6,
        deliverable="EAGLE-2's dynamic tree at several (top-k, depth, nodes): "
                    "`python -m tinyspec bench --methods ar,eagle:1,4,4,eagle:2,6,16,eagle:4,5,16,eagle:auto "
                    "--temperatures 0 --json`. Tabulate tau and speedup; explain the cost of a step as F(1 + T) plus "
                    "depth head forwards, and why a deeper tree pays on a GPU but less on your CPU."),
    "sampled_tree": Chapter(
        "9 EAGLE: drafting features, growing the tree", ("methods/growth.py:grow_sampled_tree",),
        ("tests/test_eagle.py::test_sampled_tree_keeps_whole_groups_of_draws",
         "tests/test_eagle.py::test_sampled_eagle_has_the_target_distribution",
         "tests/test_eagle.py::test_caches_after_eagle_steps_equal_plain_decoding"),
        needs=("model", "kvcache", "sampling", "tree", "verify", "rules", "eagle", "training"), hours=6,
        deliverable="A sampled tree against a top-k tree at T = 1: "
                    "`python -m tinyspec bench --methods ar,eagle:2,6,16@lossless,eagle:2,6,16@traversal,"
                    "eagle:2,6,16@pointmass --temperatures 1 --json`. Tabulate tau and speedup per rule and explain "
                    "why the sampled tree's duplicates and unpruned groups cost tau at the same F(1 + T), and why "
                    "pruning sampled children by their own value would not be exact."),
    "parallel": Chapter(
        "9 EAGLE: drafting features, growing the tree",
        ("methods/parallel.py:ParallelHead.features_ahead", "methods/parallel.py:ParallelHead.draft"),
        ("tests/test_parallel.py::test_one_forward_drafts_eagles_guess_and_medusas_heads_on_it",
         "tests/test_parallel.py::test_greedy_parallel_equals_plain_decoding",
         "tests/test_parallel.py::test_rows_of_a_batch_write_what_they_write_alone"),
        needs=("model", "kvcache", "sampling", "tree", "verify", "rules", "eagle", "sampled_tree"), hours=4,
        deliverable="One head forward per step against EAGLE's one per depth: train a parallel head "
                    "(`python -m tinyspec train parallel --steps 200`, which starts from the shipped EAGLE head), then "
                    "`python -m tinyspec bench --methods ar,eagle:1,4,4,parallel:1,4,4 --parallel "
                    "runs/eagle/parallel.safetensors --temperatures 0 --json`. Tabulate tau and speedup and "
                    "explain by the cost of proposing (depth head forwards against one) whether the lower tau of "
                    "Medusa-style depths is paid back on your CPU."),
    "lookup": Chapter(
        "10 Draft-free speculation: prompt lookup, lookahead and retrieval", ("methods/ngrams.py:NgramIndex.propose",),
        ("tests/test_lookup.py::test_index_example_and_incremental_updates_match_a_scan",
         "tests/test_lookup.py::test_greedy_lookup_equals_plain_decoding",
         "tests/test_lookup.py::test_greedy_lookup_runs_to_the_end_of_the_context",
         "tests/test_lookup.py::test_cache_after_lookup_steps_equals_plain_decoding"),
        needs=("model", "kvcache", "sampling", "tree", "verify"), hours=3,
        deliverable="Prompt lookup by prompt category: "
                    "`python -m tinyspec bench --methods ar,lookup:2,lookup:4,lookup:8 --temperatures 0 --json`. "
                    "Tabulate tau and speedup per category (code, docs, structured) and explain why text that "
                    "repeats itself accepts more, and why a lookup's proposing cost is (nearly) zero, so that any "
                    "tau above F(1 + k) pays."),
    "lookahead": Chapter(
        "10 Draft-free speculation: prompt lookup, lookahead and retrieval",
        ("methods/ngrams.py:trie", "methods/lookahead.py:window_mask", "methods/lookahead.py:step_mask",
         "methods/lookahead.py:slide"),
        ("tests/test_lookahead.py::test_masks_are_the_drawn_ones",
         "tests/test_lookahead.py::test_trie_merges_shared_prefixes_and_the_pool_keeps_the_most_recent",
         "tests/test_lookahead.py::test_slide_moves_each_level_down_and_fills_while_growing",
         "tests/test_lookahead.py::test_each_guess_sees_exactly_its_own_text",
         "tests/test_lookahead.py::test_greedy_lookahead_equals_plain_decoding"),
        needs=("model", "kvcache", "sampling", "tree", "verify"), hours=6,
        deliverable="Lookahead's window against its cost: "
                    "`python -m tinyspec bench --methods ar,lookahead:3,3,2,lookahead:5,4,4,lookahead:7,5,7 "
                    "--temperatures 0 --json`. Tabulate tau and speedup per (W, N, G) and explain by F(n): a step "
                    "feeds (N - 1) W window tokens plus the guesses' G (N - 1), nearly free on a GPU, while on your "
                    "CPU every one of them is paid for."),
    "rest": Chapter(
        "10 Draft-free speculation: prompt lookup, lookahead and retrieval",
        ("methods/rest.py:suffix_array", "methods/rest.py:Datastore.match", "methods/rest.py:corpus_tree"),
        ("tests/test_rest.py::test_suffix_array_sorts_like_python",
         "tests/test_rest.py::test_the_match_and_its_continuations_equal_a_scan_of_the_corpus",
         "tests/test_rest.py::test_the_corpus_tree_keeps_the_most_shared_prefixes_as_a_tree",
         "tests/test_rest.py::test_greedy_rest_equals_plain_decoding"),
        needs=("model", "kvcache", "sampling", "tree", "verify", "lookup"), hours=8,
        deliverable="Retrieval against the datastore's size: "
                    "`python -m tinyspec data datastore --tokens 1000000 --stdlib-only --out runs/ds1m.safetensors` "
                    "and again with 4000000 (`--out runs/ds4m.safetensors`), then for each "
                    "`python -m tinyspec bench --methods ar,lookup,rest --datastore runs/ds1m.safetensors "
                    "--temperatures 0 --profile --json`. Tabulate tau, speedup and the ledger's propose share per "
                    "size and explain by the cost model: a lookup costs two binary searches per token, microseconds, "
                    "while the target's forward over the tree (F(n) of chapter 2) is most of a step; say what a "
                    "bigger corpus buys and what it cannot."),
    "kernel": Chapter(
        "11 The Triton kernel and the fast path", ("kernels/tree_attention.py:_online_softmax_step",),
        ("tests/test_tree_attention.py::test_matches_reference",
         "tests/test_tree_attention.py::test_output_ignores_tokens_outside_the_path",
         "tests/test_tree_attention.py::test_any_strides",
         "tests/test_tree_attention.py::test_custom_scale"),
        hours=8, extra="triton",
        deliverable="The kernel against PyTorch's SDPA, on a CUDA GPU: `python -m tinyspec bench kernels`. "
                    "Tabulate its times against the tree's size and the cached length, and explain them by the "
                    "roofline: the bytes of K and V read once per head against the few FLOPs per byte of a tree "
                    "attention. (Without a GPU, say so, and explain instead, from chapter 11, what the kernel saves "
                    "on a memory-bound step.)"),
    "training": Chapter(
        "12 Training", ("training/distill.py:eagle_loss", "training/distill.py:own_chains"),
        ("tests/test_eagle.py::test_loss_is_smooth_l1_plus_weighted_cross_entropy",
         "tests/test_eagle.py::test_trained_head_predicts_features_several_steps_deep",
         "tests/test_eagle.py::test_resumed_training_equals_straight_training",
         "tests/test_eagle.py::test_training_on_own_predictions_sees_what_a_draft_chain_sees"),
        needs=("model", "kvcache", "sampling"), hours=8,
        deliverable="An EAGLE head trained on depth 1 only against one trained on its own predictions: "
                    "`python -m tinyspec train eagle --steps 200 --depth 1 --out runs/d1/eagle.safetensors`, then "
                    "`--depth 3 --out runs/d3/eagle.safetensors`, and "
                    "`python -m tinyspec evaluate --methods eagle --eagle runs/d1/eagle.safetensors` (then d3). "
                    "Tabulate tau for each and explain why training on its own features raises the acceptance of "
                    "deep nodes, and what that tau is worth by the cost model at the same F(1 + T)."),
    "costs": Chapter(
        "13 Benchmarking, costs and sizing",
        ("speed/sizing.py:Sizing.speedup", "speed/sizing.py:Sizing.forward_s", "speed/sizing.py:Sizing.step_s",
         "speed/sizing.py:Sizing.predicted_s"),
        ("tests/test_sizing.py::test_the_fastest_predicted_size_is_chosen",
         "tests/test_sizing.py::test_where_no_size_pays_plain_steps_are_chosen",
         "tests/test_sizing.py::test_the_menu_leaves_out_sizes_never_measured",
         "tests/test_sizing.py::test_the_cost_model_adds_up_each_step_at_its_measured_cost",
         "tests/test_sizing.py::test_the_forward_cost_is_interpolated_between_the_widths_measured",
         "tests/test_sizing.py::test_a_size_that_merely_ties_with_a_plain_step_is_not_taken"),
        hours=6,
        deliverable="The measurement assignment: the cost of one forward over n tokens against n, for each "
                    "shipped model, on your CPU: `python -m tinyspec figures cost --threads 1 --out runs/cost-target` "
                    "and `python -m tinyspec figures cost --threads 1 --model weights/draft.safetensors --out "
                    "runs/cost-draft` (each writes forward_cost.json, rows of tokens, seconds and plain_steps, and "
                    "forward_cost.png; it needs matplotlib: pip install -e '.[plot]'). Tabulate F(n) in one-token "
                    "forwards for both, say from which n verification stops being nearly free (F(n) > 1.1, and "
                    "> 1.5), and explain it by the roofline (arithmetic intensity of a forward over n tokens against "
                    "your CPU's FLOP/s per byte/s) and the fixed overhead of a forward. Then check the cost model: "
                    "`python -m tinyspec bench --methods ar,draft:auto,medusa:auto,eagle:auto --temperatures 0 "
                    "--json`, and compare each method's measured speedup with the predicted_speedup of the size --size "
                    "auto chose (the report's \"sizing\" rows, made by your Sizing.speedup from the measured step "
                    "costs): where they differ, say which term of the cost model missed."),
    "batch": Chapter(
        "14 Batch > 1: speculation against batching", ("kvcache.py:feed",),
        ("tests/test_batch.py::test_rows_of_different_lengths_equal_their_own_single_caches",
         "tests/test_batch.py::test_greedy_rows_equal_plain_decoding_at_every_batch_size",
         "tests/test_batch.py::test_each_rows_cache_equals_plain_decodings",
         "tests/test_batch.py::test_rows_that_are_done_leave_the_batch_and_the_rest_go_on"),
        needs=("model", "kvcache", "sampling", "tree", "verify"), hours=6,
        deliverable="Speculation against batching: "
                    "`python -m tinyspec bench --batch-sizes 1,2,4,8,16 --methods ar,medusa:16,medusa:auto "
                    "--temperatures 0 --json`. Plot total tokens/s and latency per sequence against the batch size "
                    "and explain the crossing by F(n): a batch of B rows and a tree of T nodes both fill the same "
                    "forward (B (1 + T) tokens), so once the batch alone makes the step compute-bound, speculation "
                    "no longer pays."),
}


def chapters_table() -> str:
    """`CHAPTERS` as the walkthrough's Markdown table: a row per chapter, with the walkthrough
    chapter that teaches it, its functions (`file.py: first`, then the others of that file), how
    many tests grade it and the hours it takes. The book holds this text verbatim (tests/test_docs.py
    checks it)."""
    rows = ["| chapter | walkthrough | functions to write | graded tests | hours |", "|---|---|---|---|---|"]
    for c, ch in CHAPTERS.items():
        by_file = {}
        for f in ch.functions:
            file, qualname = f.split(":")
            by_file.setdefault(file, []).append(qualname)
        functions = ", ".join(f"`{file}: {names[0]}`" + "".join(f", `{n}`" for n in names[1:])
                              for file, names in by_file.items())
        rows.append(f"| `{c}` | {ch.walkthrough.split()[0]} | {functions} | {len(ch.tests)} | {ch.hours} |")
    return "\n".join(rows) + "\n"
