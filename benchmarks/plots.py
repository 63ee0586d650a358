"""PNG plots of the long-input speed results: speed and acceptance length against length."""

from __future__ import annotations

import json
from pathlib import Path


def plot_speed(results_path: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    record = json.loads(results_path.read_text())
    rows = record["table"]
    methods = list(dict.fromkeys(row["method"] for row in rows))
    panels = {
        "speed_vs_length": ("decode_tokens_per_s", "decode tokens/s"),
        "acceptance_vs_length": ("mean_acceptance_length", "mean acceptance length"),
    }
    saved = []
    for name, (key, label) in panels.items():
        figure, axes = plt.subplots(figsize=(6, 4))
        for index, method in enumerate(methods):
            points = [(row["length"], row[key]) for row in rows if row["method"] == method and row[key] is not None]
            if points:
                axes.plot(*zip(*points), marker="os^vD"[index % 5], linestyle=("-", "--")[index % 2], label=method)
        axes.set_xscale("log", base=2)
        axes.set_xlabel("prompt tokens")
        axes.set_ylabel(label)
        axes.set_title(f"{label} against prompt length ({record['machine']['cpu']})", fontsize=8)
        axes.grid(alpha=0.3)
        axes.legend(fontsize=8)
        path = results_path.with_name(f"{results_path.stem}_{name}.png")
        figure.tight_layout()
        figure.savefig(path, dpi=120)
        plt.close(figure)
        saved.append(path)
    return saved
