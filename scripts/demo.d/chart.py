"""`helm install` / `helm uninstall` of helm/bouncer for scripts/demo --node, with Helm's own
engine (helm-python-sdk, from the virtualenv scripts/helm-test creates; no helm binary needed).

    chart.py install NAMESPACE VALUES_JSON
    chart.py uninstall NAMESPACE
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import helm_python as helm

CHART = Path(__file__).resolve().parents[2] / "helm" / "bouncer"


def main(argv: list[str]) -> int:
    if len(argv) < 2 or argv[0] not in ("install", "uninstall") or (argv[0] == "install") != (len(argv) == 3):
        print(__doc__, file=sys.stderr)
        return 2
    namespace = argv[1]
    cfg = helm.Config(kubeconfig_path=os.environ["KUBECONFIG"], namespace=namespace)
    try:
        if argv[0] == "uninstall":
            cfg.uninstall("bouncer", ignore_not_found=True, timeout=60)
            return 0
        release = cfg.install(str(CHART), "bouncer", json.loads(argv[2]), namespace=namespace, timeout=60)
        print(f"helm install bouncer helm/bouncer -n {namespace}: {release['status']},"
              f" revision {release.get('version', 1)}")
        return 0 if release["status"] == "deployed" else 1
    finally:
        cfg.close()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
