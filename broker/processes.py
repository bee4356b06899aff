"""What the operating system says about a process, by pid (through psutil)."""

from __future__ import annotations

import psutil

__all__ = ["command_line", "running"]


def running(pid: int) -> bool:
    """Whether ``pid`` exists and is not a zombie (nor dead)."""
    try:
        return psutil.Process(pid).status() not in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD)
    except psutil.Error:
        return False


def command_line(pid: int) -> str:
    """``pid``'s command line, its words joined by spaces ("" if it is gone or hidden)."""
    try:
        return " ".join(psutil.Process(pid).cmdline())
    except psutil.Error:
        return ""
