"""Figure helpers every figure of `analysis` uses: saving as PNG and PDF, one color per method,
a client x client heatmap."""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402


def save_figure(fig, out: Path, name: str) -> list[Path]:
    """`fig` as `<out>/<name>.png` (150 dpi) and `.pdf`, then closed; returns both paths."""
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / f"{name}.png", out / f"{name}.pdf"]
    for path in paths:
        fig.savefig(path, dpi=150 if path.suffix == ".png" else None, bbox_inches="tight")
    plt.close(fig)
    return paths


def method_colors(methods) -> dict[str, str]:
    """One color per method, the same in every panel."""
    cycle = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    return {m: cycle[i % len(cycle)] for i, m in enumerate(sorted(set(methods)))}


def heatmap(ax, matrix: np.ndarray, ids, title: str):
    image = ax.imshow(matrix, vmin=0, vmax=1, cmap="viridis")
    ax.set_xticks(range(len(ids)), ids)
    ax.set_yticks(range(len(ids)), ids)
    ax.set(title=title, xlabel="client", ylabel="client")
    ax.title.set_fontsize(8)
    if len(ids) <= 10:
        for i in range(len(ids)):
            for j in range(len(ids)):
                ax.text(j, i, f"{matrix[i, j]:.2f}", ha="center", va="center", fontsize=6,
                        color="white" if matrix[i, j] < 0.6 else "black")
    plt.colorbar(image, ax=ax, fraction=0.046)
