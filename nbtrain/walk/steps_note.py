"""What a change of the global batch does to a schedule that counts optimizer steps, said, never done (rule 8).

A warm-up or decay written in steps (the user's LambdaLR stepped every step, OneCycleLR, nbtrain's own
warmup_steps) covers as many samples as its steps hold: at a global batch 16x larger each step is 16x the samples,
so a warm-up of 5 steps becomes 16x the samples' worth and an epoch holds 16x fewer steps of the decay. nbtrain
keeps the schedule in steps, as the user wrote it, and says so; laying it over samples is the user's choice
(schedule_counts='samples', engine/rates.schedule_position).
"""
from __future__ import annotations


def steps_note(start, chosen, interval: str | None, stepping: str = "") -> str:
    """The note for the walk's learning-rate line ('' where the global batch is unchanged or nothing counts steps).
    `interval`: how often the live schedule is stepped ('step', 'epoch', or None: no schedule); `stepping`: which
    schedule that is, in words (Schedule.stepping)."""
    before, after = start.global_batch_size, chosen.global_batch_size
    if before == after:
        return ""
    factor = after / before
    said = []
    if interval == "step":
        said.append(f"your schedule ({stepping or 'stepped every step'}) counts optimizer steps: at global batch "
                    f"{after} instead of {before} each of its steps is {factor:.3g}x the samples, so a warm-up or "
                    f"decay written in steps passes over {factor:.3g}x the samples, and an epoch holds "
                    f"{factor:.3g}x {'fewer' if factor > 1 else 'more'} of its steps")
    if chosen.warmup_steps:
        said.append(f"warmup_steps={chosen.warmup_steps} becomes {chosen.warmup_steps * after:,} samples' worth "
                    f"(was {chosen.warmup_steps * before:,})")
    if not said:
        return ""
    if chosen.schedule_counts == "samples" and chosen.base_batch_size:
        return (f"your schedule and warm-up are laid over samples, as asked (schedule_counts='samples': "
                f"{chosen.global_batch_size / chosen.base_batch_size:.3g} of its steps per step)")
    return "; ".join(said) + ("; kept in steps, as written: nbtrain does not rescale a schedule unasked "
                              "(schedule_counts='samples' lays it over samples)")
