"""The GPU check scripts' report: one "ok"/"FAIL" line per check, and the exit status."""
import sys

failures = []


def check(name, ok, detail=""):
    """Prints the check's line and remembers a failure."""
    print(("ok   " if ok else "FAIL ") + name + (f": {detail}" if detail else ""), flush=True)
    if not ok:
        failures.append(name)


def finish():
    """Prints the count of failures and exits 1 if there was any."""
    print(f"{len(failures)} failed")
    sys.exit(1 if failures else 0)
