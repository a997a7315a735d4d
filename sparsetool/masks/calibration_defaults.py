"""The defaults of calibrated pruning's settings: OWL's and DSnoT's from their papers
(:mod:`sparsetool.masks.owl`, :mod:`sparsetool.masks.dsnot`) and the fewest calibration tokens a
Mixture of Experts' expert is pruned from. Torch-free, so that checking prune's options never
imports torch."""

__all__ = ["DSNOT_ITERATIONS", "DSNOT_THRESHOLD", "EXPERT_MIN_TOKENS", "OWL_LAMBDA", "OWL_M"]

OWL_M = 5.0  # OWL: a score above M times its block's mean is an outlier
OWL_LAMBDA = 0.08  # OWL: the block sparsities spread over 2 x lambda
DSNOT_ITERATIONS = 50  # DSnoT: at most this many swaps per row
DSNOT_THRESHOLD = 0.1  # DSnoT: a row whose expected error is this small is left alone
# Mixture of Experts: an expert routed fewer calibration tokens than this is pruned by magnitude
# (its inputs' statistics would rest on too few tokens to stand for what it sees).
EXPERT_MIN_TOKENS = 32
