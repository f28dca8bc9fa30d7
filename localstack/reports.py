"""Summarises Lambda REPORT lines: reports.py NAME SINCE_MS < JSON array of
[timestamp ms, message] pairs.

Prints the number of invocations since SINCE_MS, their median and 90th
percentile Duration, and every cold start of the log group: the Init
Duration its REPORT line gives and the Duration of that first invocation. Under aws-lambda-rie (LocalStack on the
host), Init Duration ends when RIE has started the runtime, before the
runtime's own initialisation, which falls into the first invocation's
Duration instead.
"""

import json
import re
import statistics
import sys

FIELD = re.compile(r"(Init Duration|Duration): ([\d.]+) ms")


def main() -> None:
    name, since = sys.argv[1], int(sys.argv[2])
    durations, colds = [], []
    for stamp, line in json.load(sys.stdin) or []:
        fields = dict(FIELD.findall(line))
        if "Duration" not in fields:
            continue
        d = float(fields["Duration"])
        if stamp >= since:
            durations.append(d)
        if "Init Duration" in fields:
            colds.append((float(fields["Init Duration"]), d))
    if not durations:
        print(f"  {name}: no invocations")
        return
    durations.sort()
    p90 = durations[min(len(durations) - 1, int(0.9 * len(durations)))]
    print(f"  {name}: {len(durations)} invocations, median {statistics.median(durations):.1f} ms, p90 {p90:.1f} ms")
    for init, first in colds:
        print(f"    cold start: Init Duration {init:.2f} ms, first invocation {first:.1f} ms")


if __name__ == "__main__":
    main()
