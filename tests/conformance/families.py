"""The registry of the conformance suite: one tiny configuration per family (or variant).

A new family joins every conformance check by adding one ``Family`` here.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import ssmhub


@dataclass(frozen=True)
class Family:
    name: str
    config_class: type
    config_kwargs: dict = field(default_factory=dict)
    causal_lm: type | None = None
    sequence_classification: type | None = None
    token_classification: type | None = None

    def config(self, **overrides):
        base = {"vocab_size": 64, "hidden_size": 16, "num_hidden_layers": 2, "pad_token_id": 0}
        return self.config_class(**{**base, **self.config_kwargs, **overrides})


FAMILIES = [
    Family(
        "dlr",
        ssmhub.DLRConfig,
        {"state_size": 8, "intermediate_size": 32, "weight_std": 0.2},
        ssmhub.DLRForCausalLM,
        ssmhub.DLRForSequenceClassification,
        ssmhub.DLRForTokenClassification,
    ),
    Family(
        "dlr-prod-postnorm-glu",
        ssmhub.DLRConfig,
        {"state_size": 4, "kernel_type": "prod", "prenorm": False, "use_glu": True, "skip_connection": "learned"},
        ssmhub.DLRForCausalLM,
        ssmhub.DLRForSequenceClassification,
        ssmhub.DLRForTokenClassification,
    ),
    Family(  # Eq. 5 with a Λ per direction: classification only, it cannot decode
        "dlr-bidirectional",
        ssmhub.DLRConfig,
        {"state_size": 8, "bidirectional": True, "bidirectional_shared_lambda": False},
        None,
        ssmhub.DLRForSequenceClassification,
        ssmhub.DLRForTokenClassification,
    ),
    Family(  # the authors' code: centred columns over the largest column p-norm, MLP input map, learned x_0
        "bdlrnn",
        ssmhub.BDLRNNConfig,
        {"block_size": 4, "transition_hidden_size": 32, "scan": "parallel", "last_layer_residual": False},
        ssmhub.BDLRNNForCausalLM,
        ssmhub.BDLRNNForSequenceClassification,
        ssmhub.BDLRNNForTokenClassification,
    ),
    Family(  # the paper's reading: Eq. 6 per-column projection, v = B u, x_0 = 0; loop-over-time scan
        "bdlrnn-paper",
        ssmhub.BDLRNNConfig,
        {
            "block_size": 8,
            "norm_mode": "paper",
            "input_map": "linear",
            "learned_initial_state": False,
            "scan": "sequential",
        },
        ssmhub.BDLRNNForCausalLM,
        ssmhub.BDLRNNForSequenceClassification,
        ssmhub.BDLRNNForTokenClassification,
    ),
    Family(
        "h3",
        ssmhub.H3Config,
        {"max_kernel_length": 12, "intermediate_size": 32, "attention_layers": [], "squash_lambda": 0.0},
        ssmhub.H3ForCausalLM,
        ssmhub.H3ForSequenceClassification,
        ssmhub.H3ForTokenClassification,
    ),
    Family(  # hybrid: attention at layer 1 (its key/values in the same cache), 2 SSM heads, regularized kernels
        "h3-hybrid",
        ssmhub.H3Config,
        {
            "num_hidden_layers": 3,
            "max_kernel_length": 16,
            "attention_layers": [1],
            "num_attention_heads": 2,
            "ssm_num_heads": 4,
            "smooth_width": 1,
            "kernel_regularization_order": ["smooth", "squash", "dropout"],
        },
        ssmhub.H3ForCausalLM,
        ssmhub.H3ForSequenceClassification,
        ssmhub.H3ForTokenClassification,
    ),
    Family(  # the original H3: an S4D diagonal SSM per head instead of a learned long kernel
        "h3-ssm",
        ssmhub.H3Config,
        {"kernel_type": "diagonal_ssm", "ssm_state_size": 8, "intermediate_size": 32, "attention_layers": []},
        ssmhub.H3ForCausalLM,
        ssmhub.H3ForSequenceClassification,
        ssmhub.H3ForTokenClassification,
    ),
    Family(  # SeRpEnt's default layout: a whole Mamba plus two narrow κ branches added through output projections,
        # causal resampling; the projections start non-zero here, so that every check exercises the branches
        "serpent",
        ssmhub.SerpentConfig,
        {
            "resampling_rates": [0.5, 0.25],
            "resampling_window": 3,
            "num_distance_features": 4,
            "state_size": 4,
            "branch_output_init_std": 0.2,
        },
        ssmhub.SerpentForCausalLM,
        ssmhub.SerpentForSequenceClassification,
        ssmhub.SerpentForTokenClassification,
    ),
    Family(  # SeRpEnt as the paper's LM reads: a base branch and a κ = 0.5 branch concatenated, causal resampling
        "serpent-concatenated",
        ssmhub.SerpentConfig,
        {
            "resampling_rates": [0.5],
            "resampling_window": 3,
            "num_distance_features": 4,
            "state_size": 4,
            "branch_layout": "concatenated",
        },
        ssmhub.SerpentForCausalLM,
        ssmhub.SerpentForSequenceClassification,
        ssmhub.SerpentForTokenClassification,
    ),
    Family(  # only the base branch: exactly Mamba (transformers' MambaForCausalLM weights load into it)
        "serpent-mamba",
        ssmhub.SerpentConfig,
        {"resampling_rates": [], "state_size": 4},
        ssmhub.SerpentForCausalLM,
        ssmhub.SerpentForSequenceClassification,
        ssmhub.SerpentForTokenClassification,
    ),
    Family(  # the paper's faithful (non-causal) resampling, two compressed branches: classification only
        "serpent-faithful",
        ssmhub.SerpentConfig,
        {
            "hidden_size": 18,
            "resampling_rates": [0.5, 0.2],
            "resampling_window": 5,
            "resampling_mode": "faithful",
            "branch_layout": "concatenated",
            "state_size": 4,
        },
        None,
        ssmhub.SerpentForSequenceClassification,
        ssmhub.SerpentForTokenClassification,
    ),
]
