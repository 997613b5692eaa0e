"""FedL2P (Lee et al., NeurIPS 2023): federated learning of fine-tuning policies with meta-nets.

The methods `fedl2p` (`algorithm.py`) and `l2p` (`l2p.py`, the same meta-learning per client
alone), and the building blocks they share with `ft` (FT BN C/G/I, fl_core/algorithms/ft.py),
which personalize a pretrained model (the `pretrained` knob; fl_core/checkpoints.py):
- `bn_mixing`: a context manager under which every BatchNorm layer normalises with a β-weighted
  mix of its pretrained running statistics and the client's (or the incoming batch's) statistics,
  differentiably in β and compatible with `torch.func.functional_call`;
- `metanets`: BNNet and LRNet, the small MLPs that map a client's data statistics to β per
  BatchNorm layer and a learning rate per parameter tensor, and the statistics they read
  (per-layer input mean/SD, per-BN-layer symmetric KL to the pretrained statistics);
- `hypergrad`: the implicit-function-theorem hypergradient with a Neumann-series inverse Hessian
  (ψ = 0.1, Q = 3, the paper's scale or the exact one), clipped;
- `personalize`: a client's fine-tuning `Policy`, fine-tuning and scoring under it, λ (`MetaNets`)
  and one meta iteration on one client (`meta_step`: IFT or FOMAML+).
"""
