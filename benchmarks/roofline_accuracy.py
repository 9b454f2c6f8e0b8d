"""The roofline against published step latencies: every point of
tests/data/published_step_latencies.csv priced by RooflineCostModel with its default
constants, printed as a markdown table (the one in docs/fidelity.md), held-out points
marked; with --fit, also the constants calibration.published.fit_constants chooses on the
points not held out.

    python benchmarks/roofline_accuracy.py
    python benchmarks/roofline_accuracy.py --fit
"""

from __future__ import annotations

import argparse

from calibration.published import (
    TOLERANCE,
    fit_constants,
    price,
    read_published_steps,
    relative_error,
)


def error_table() -> list[str]:
    """Markdown rows: id, GPU, model, step, measured, priced, error, tolerance, held out."""
    lines = ["| point | GPU | model | step | measured ms | roofline ms | error | limit "
             "| held out |", "|---|---|---|---|---:|---:|---:|---:|---|"]
    for s in read_published_steps():
        step = (f"{s.num_decode_seqs} decodes x {s.decode_context_per_seq} ctx"
                if s.kind == "decode" else f"prefill {s.num_prefill_tokens}")
        lines.append(
            f"| {s.id} | {s.gpu} | {s.model} | {step} | {s.measured_s * 1e3:.2f} | "
            f"{price(s) * 1e3:.2f} | {relative_error(s) * 100:+.1f}% | "
            f"{TOLERANCE[s.kind] * 100:.0f}% | {'yes' if s.held_out else ''} |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fit", action="store_true", help="also print the fitted constants")
    args = parser.parse_args()
    print("\n".join(error_table()))
    if args.fit:
        constants, worst = fit_constants(read_published_steps())
        print(f"\nfitted on the points not held out: {constants} "
              f"(largest |error| there {worst * 100:.1f}%)")


if __name__ == "__main__":
    main()
