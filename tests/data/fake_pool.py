"""A stand-in for someone's instance pool, driven the way the script provider drives one.

    fake_pool.py STATE list          print the pool in spotring's line format (v1)
    fake_pool.py STATE resize SIZE   hold SIZE members: launch or retire the newest
    fake_pool.py STATE replace ID    retire ID and launch a member in its place

STATE is a JSON file: {"next": N, "members": {id: state}}.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main() -> int:
    path, command, *args = sys.argv[1:]
    state_file = Path(path)
    pool = json.loads(state_file.read_text())
    members: dict[str, str] = pool["members"]
    live = [i for i, s in members.items() if s == "ready"]

    def launch() -> None:
        members[f"node-{pool['next']}"] = "ready"
        pool["next"] += 1

    if command == "list":
        print("# spotring-group v1")
        for index, (member, state) in enumerate(members.items()):
            print(f"{member} 10.9.0.{index + 1} {state} 1")
        # Retired members are reported once as gone, then forgotten, as clouds do.
        pool["members"] = {i: s for i, s in members.items() if s != "gone"}
    elif command == "resize":
        size = int(args[0])
        for _ in range(size - len(live)):
            launch()
        for member in live[size:]:
            members[member] = "gone"
    elif command == "replace":
        if members.get(args[0]) == "ready":
            members[args[0]] = "gone"
            launch()
    else:
        print(f"unknown command {command}", file=sys.stderr)
        return 2
    state_file.write_text(json.dumps(pool))
    return 0


if __name__ == "__main__":
    sys.exit(main())
