"""Runs once they have ended: `result` (RunResult and its summary), `store` (the SQLite run
history behind %nbtrain_runs), `compare` (two or more runs side by side, with a verdict)."""
