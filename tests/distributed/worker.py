"""One rank of a launch.run() job: calls module:function and writes its result as JSON."""

import importlib
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main() -> None:
    target, out_dir = sys.argv[1], sys.argv[2]
    rank = os.environ["RANK"]  # (the function may unset it)
    module, function = target.split(":")
    result = getattr(importlib.import_module(module), function)()
    with open(os.path.join(out_dir, f"result{rank}.json.tmp"), "w") as f:
        json.dump(result, f)
    os.replace(os.path.join(out_dir, f"result{rank}.json.tmp"),
               os.path.join(out_dir, f"result{rank}.json"))
    if isinstance(result, dict) and result.get("exit_at_once"):
        # A process whose peer died: JAX's exit waits for its heartbeat timeout (100 s)
        # before giving up on the peer (docs/distributed.md); the test need not wait.
        sys.stdout.flush()
        os._exit(0)


if __name__ == "__main__":
    main()
