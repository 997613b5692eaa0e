"""FedL2P (Lee et al., NeurIPS 2023): federated learning of fine-tuning policies with meta-nets.

Building blocks so far (nothing else in `fl_core` imports this package yet):
- `metanets`: BNNet and LRNet, the small MLPs that map a client's data statistics to a BN-mixing
  coefficient β per BatchNorm layer and a learning rate per parameter tensor, and the statistics
  they read (per-layer input mean/SD, per-BN-layer symmetric KL to the pretrained statistics);
- `bn_mixing`: a context manager under which every BatchNorm layer normalises with a β-weighted
  mix of its pretrained running statistics and the client's (or the incoming batch's) statistics,
  differentiably in β and compatible with `torch.func.functional_call`;
- `hypergrad`: the implicit-function-theorem hypergradient with a Neumann-series inverse Hessian
  (ψ = 0.1, Q = 3, the paper's scale or the exact one), clipped.

The meta-learning loop (functional fine-tuning under BN mixing, FOMAML+, FedAvg of the
meta-nets) and the two-stage study are still to come (issue 13).
"""
