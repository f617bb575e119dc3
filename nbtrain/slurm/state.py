"""What SLURM says about a job: its state, why, and whether waiting can still help.

`scontrol show job -o ID` prints one line of Key=Value fields; JobState is read from it.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

TERMINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL",
            "DEADLINE", "PREEMPTED", "GONE"}
# Pending reasons that no amount of waiting fixes (sites that do not refuse such jobs at sbatch).
NEVER_STARTS = {"PartitionNodeLimit": "more nodes than the partition allows",
                "PartitionTimeLimit": "a longer time limit than the partition allows",
                "PartitionConfig": "resources the partition does not have",
                "BadConstraints": "constraints no node satisfies",
                "InvalidAccount": "an account that does not exist", "InvalidQOS": "a QOS that does not exist",
                "DependencyNeverSatisfied": "a dependency that can no longer be met"}


@dataclass(frozen=True)
class JobState:
    state: str
    reason: str = "None"
    exit_code: str = "0:0"
    nodes: str = ""
    restarts: int = 0

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL

    def __str__(self) -> str:
        text = self.state
        if self.state == "RUNNING" and self.nodes:
            text += f" on {self.nodes}"
        details = [r for r in (self.reason,) if r and r != "None"]
        if self.terminal and self.exit_code not in ("", "0:0"):
            details.append(f"exit {self.exit_code}")
        if self.restarts:
            details.append(f"requeued {self.restarts}x")
        return text + (f" ({', '.join(details)})" if details else "")


def parse_job(text: str, job_id: str, job_name: str) -> JobState:
    """Fields of `scontrol show job -o`. The job name comes first and may contain anything
    (even "JobState=..."), so the known prefix is cut off before the fields are read."""
    prefix = f"JobId={job_id} JobName={job_name} "
    rest = text[len(prefix):] if text.startswith(prefix) else text

    def field(name: str, default: str = "") -> str:
        found = re.search(rf"(?:^| ){name}=(\S*)", rest)
        return found.group(1) if found else default

    restarts = field("Restarts", "0")
    return JobState(field("JobState", "UNKNOWN"), field("Reason", "None"), field("ExitCode", ""),
                    field("NodeList", ""), int(restarts) if restarts.isdigit() else 0)
