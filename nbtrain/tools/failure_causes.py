"""Plain words for errors whose message names a symptom, not its cause: a tool's "failed: ..." row adds them.

A data set whose items are not all one size (pytorch/examples' word-language model cut into chunks of 35 tokens,
its last chunk 34) trains until a batch holds the short item beside the others: torch's default collate then
raises "stack expects each tensor to be equal size", which says nothing of the data. A larger batch meets the
short item sooner, so every batch the walk tries fails with it while the user's own config seemed to run.
"""
from __future__ import annotations

CAUSES = {
    "stack expects each tensor to be equal size": (
        "the data's items differ in size (a shorter last item?): pad them in a collate_fn or drop the short one"),
}


def explained(line: str) -> str:
    """`line` (a failure's one line) with the cause of a known symptom after it, or as it is."""
    return next((f"{line} -- {why}" for symptom, why in CAUSES.items() if symptom in line), line)


def none_ran(notes: list[str]) -> str:
    """An item's one line where none of its candidates ran: their failure once where they all failed alike (the
    same line, or the same known symptom: the entries a stack error names differ from batch to batch)."""
    shared = [symptom for symptom in CAUSES if notes and all(symptom in note for note in notes)]
    if shared:
        return f"no candidate ran: every one failed with {shared[0]!r} -- {CAUSES[shared[0]]}"
    return f"no candidate ran: every one {notes[0]}" if notes and len(set(notes)) == 1 else "no candidate ran"
