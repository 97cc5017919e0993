"""Chinchilla's scaling laws: about 20 tokens per parameter, a run's C = 6ND, the compute-optimal split of
a budget and the loss Chinchilla's fit gives a plan (its data and tokenizer, not ours: the shape of the trade,
not this run's numbers)."""

from __future__ import annotations

from hf_pretrain.model.llama import TRAINING_FLOPS_PER_PARAMETER, dense_flops_per_token

# Chinchilla (Hoffmann et al. 2022): about 20 training tokens per parameter is compute-optimal.
TOKENS_PER_PARAMETER = 20
# Chinchilla's parametric loss L(N, D) = E + A / N^alpha + B / D^beta ("approach 3" of Hoffmann et al.
# 2022), with the coefficients of its replication by Besiroglu, Erdil, Barnett and You 2024, "Chinchilla
# Scaling: A replication attempt" (arXiv:2404.10102, Table 1), which corrects the original fit: its
# compute-optimal split is ~20 tokens per parameter, consistent with Hoffmann's approaches 1 and 2.
CHINCHILLA_E, CHINCHILLA_A, CHINCHILLA_B = 1.8172, 482.01, 2085.43
CHINCHILLA_ALPHA, CHINCHILLA_BETA = 0.3478, 0.3658


def chinchilla_tokens(n_params: float) -> float:
    return TOKENS_PER_PARAMETER * n_params


def training_flops(n_params: float, tokens: float) -> float:
    """C = 6ND: forward (2N) and backward (4N) FLOPs per token, attention left out."""
    return dense_flops_per_token(n_params) * tokens


def compute_optimal(compute_flops: float) -> tuple[float, float]:
    """(N_opt parameters, D_opt tokens) minimising Chinchilla's L(N, D) for a budget of C = 6ND FLOPs.

    With G = (alpha A / (beta B))^(1 / (alpha + beta)) (Hoffmann et al. 2022, eq. 4):
    N_opt = G (C/6)^(beta / (alpha + beta)) and D_opt = (C/6) / N_opt, so 6 N_opt D_opt = C exactly.
    """
    a, b = CHINCHILLA_ALPHA, CHINCHILLA_BETA
    g = (a * CHINCHILLA_A / (b * CHINCHILLA_B)) ** (1.0 / (a + b))
    parameter_tokens = compute_flops / TRAINING_FLOPS_PER_PARAMETER  # C/6 = N D
    n_opt = g * parameter_tokens ** (b / (a + b))
    return n_opt, parameter_tokens / n_opt


def chinchilla_loss(n_params: float, tokens: float) -> float:
    """Chinchilla's fitted loss for N parameters trained on D tokens (its data and tokenizer, not ours:
    a guide to the shape of the trade, not a prediction of this run's numbers)."""
    return CHINCHILLA_E + CHINCHILLA_A / n_params**CHINCHILLA_ALPHA + CHINCHILLA_B / tokens**CHINCHILLA_BETA
