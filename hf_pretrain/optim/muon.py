"""Muon on the decoder's matrices and AdamW on the rest, as one optimizer.

Muon (orthogonalised momentum: each update is the momentum's nearest semi-orthogonal matrix, found
by a few Newton-Schulz iterations) only makes sense for 2-D weights that multiply activations: the
attention and MLP projections of every decoder layer. The embedding (a lookup, tied to the head
here), the head and the norms stay on AdamW, as in nanochat and the modded-nanogpt records.

`torch.optim.Muon` with `adjust_lr_fn="match_rms_adamw"` scales each update to the RMS of an AdamW
update (0.2 * sqrt(max(rows, cols))), so AdamW's learning rate and weight decay carry over: the
schedule drives both optimizers with one rate, and `muon_learning_rate` scales the matrices' share
(each group's `lr_scale`).

`MuonAdamW` is one `torch.optim.Optimizer` to Accelerate and to checkpoints: its `param_groups` and
`state` are the two inner optimizers' own objects, so `state_dict()` holds both states (the Muon
momentum of every matrix, AdamW's two moments of the rest) and a resume restores them bitwise.
"""

from __future__ import annotations

from typing import Any

import torch

MUON_GROUP = "muon"  # a param group's key: True on the matrices Muon trains
LR_SCALE = "lr_scale"  # a param group's key: its rate as a multiple of the schedule's


def is_muon_matrix(name: str, param: torch.Tensor) -> bool:
    """A decoder layer's 2-D weight (q/k/v/o, gate/up/down); never the embedding, head or a norm."""
    return param.ndim == 2 and ".layers." in f".{name}"


class MuonAdamW(torch.optim.Optimizer):
    """`torch.optim.Muon` over `matrices`, `torch.optim.AdamW` over every group of `adamw_groups`."""

    def __init__(
        self,
        matrices: list[torch.Tensor],
        adamw_groups: list[dict[str, Any]],
        *,
        lr: float,
        muon_lr_scale: float,
        weight_decay: float,
        momentum: float,
        betas: tuple[float, float],
        eps: float,
        fused: bool,
    ):
        self.muon = torch.optim.Muon(
            [{"params": matrices, MUON_GROUP: True, LR_SCALE: muon_lr_scale}],
            lr=lr * muon_lr_scale,
            weight_decay=weight_decay,
            momentum=momentum,
            nesterov=True,
            adjust_lr_fn="match_rms_adamw",
        )
        groups = [{**group, MUON_GROUP: False, LR_SCALE: 1.0} for group in adamw_groups]
        self.adamw = torch.optim.AdamW(groups, lr=lr, betas=betas, eps=eps, fused=fused)
        # The outer optimizer holds the inner ones' group dicts themselves (add_param_group keeps
        # the dict it is given), so a rate set on the outer group is the rate the inner step reads.
        super().__init__(self.muon.param_groups + self.adamw.param_groups, defaults={})
        self._share_state()

    def _share_state(self) -> None:
        """One state dict for all three, keyed by parameter; re-made after every load."""
        self.muon.param_groups = [g for g in self.param_groups if g[MUON_GROUP]]
        self.adamw.param_groups = [g for g in self.param_groups if not g[MUON_GROUP]]
        for inner in (self.muon, self.adamw):
            for param, state in inner.state.items():
                self.state.setdefault(param, state)
            inner.state = self.state

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self.muon.step()
        self.adamw.step()
        return loss

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        groups = state_dict.get("param_groups", [])
        if len(groups) != len(self.param_groups) or any(MUON_GROUP not in g for g in groups):
            raise ValueError(
                "the checkpoint's optimizer state is not Muon + AdamW's (another optimizer, or another split "
                "of the parameters): resume it with the optimizer it was saved with"
            )
        super().load_state_dict(state_dict)
        self._share_state()
