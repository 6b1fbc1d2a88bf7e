"""Names that verl_ext's config, algorithms, trainers and agent loop share (no imports: anything may import it).

``verl_ext.config`` validates against these; the modules that implement them (``algos/``, ``rollout/``) use the
same tuples, so an allowed value and its implementation cannot drift apart.
"""

ADV_ESTIMATORS = ("edge_grpo", "gepo")  # algorithm.adv_estimator values verl_ext registers with verl
BASE_ADVANTAGES = ("grpo", "drgrpo", "rloo")  # algorithm.gepo.base (besides edge_grpo): algos/grpo.py
ENTROPY_ESTIMATORS = ("token_mean", "sum_mean", "resp_mean_of_means", "full_entropy")  # algos/gepo.py
THRESHOLD_SOURCES = ("ema", "window")  # algorithm.gepo.threshold_source: algos/history.py
EMA_INITS = ("first_batch", "warmup_pool")  # algorithm.gepo.ema_init: algos/history.py
GEC_AGENT_NAME = "gec_agent"  # the agent loop verl_ext registers (rollout/gec_agent_loop.py)
# GEC's credit options (docs/gec.md "Credit options"), the paper's first: which wrong responses GEC edits
# (rollout/gec_agent_loop.py), what the policy's own tokens before an edit get, how injected answer/solution tokens
# are trained (algos/gec_credit.py)
GEC_EDIT_SCOPES = ("all", "all_wrong_groups")
GEC_PREFIX_ADVANTAGES = ("after", "before", "zero")
GEC_INJECTED_LOSSES = ("policy", "shaped")
# algorithm.gec.mode: GEC's branches (the paper), +Force-R (cue + continuation only), or prompt-side hints
# (docs/hints.md: a prefix of the reference solution before the policy writes, in all-wrong training groups)
GEC_MODES = ("gec", "force_reflect", "hint")
# mode=hint (docs/hints.md; rollout/hints.py): where the hint goes (the assistant turn starts with it, or a template
# appended to the last user message), and how many members of an all-wrong group get it (one: Scaf-GRPO, the lowest
# level whose sample is right replaces one member; all: GHPO, the whole group regenerated, level raised while all wrong)
GEC_HINT_PLACEMENTS = ("assistant_prefix", "user")
GEC_HINT_SCOPES = ("one", "all")
# the built-in hint cut rules (rollout/hints.py registers them under these names; register_hint_rule adds others)
HINT_PLACEHOLDER = "{hint}"  # where algorithm.gec.hint_template puts the hint (hint_placement=user)
HINT_RULE_MATH = "math"
HINT_RULE_TOY = "toy"

# A per-row column verl_ext's trainers add to every row they send to rollout while GEC is on: True on training
# rows, False on validation rows. verl hands row columns to agent loops as keyword arguments, so ``gec_agent``
# reads it there and corrects training rollouts only.
TRAINING_ROLLOUT_KEY = "verl_ext_training_rollout"

# Keys a row may set in ``extra_info["sampling_params"]`` (rollout/gec_agent_loop.py applies them to that row only)
ROW_SAMPLING_KEYS = ("temperature", "top_p", "top_k")

# The suffix of a data source's greedy copy (``<source>@greedy``: each held-out prompt once at temperature 0, beside
# its sampled copy; verl_ext/toy/reason.py): the end-of-run table and the run report draw the two together
GREEDY_SUFFIX = "@greedy"
