"""Local — each client trains alone on its own data; nothing is communicated.

The usual lower bound of collaboration in personalized FL papers (e.g. FedSelect, Table 1).
Evaluated per client: its own model after local training (`acc_local`).
"""
from __future__ import annotations

from .base import Algorithm, Scored


class Local(Algorithm):
    name = "local"
    display = "Local"
    acc_from = Scored.LOCAL
    communicates = False
