#!/usr/bin/env python3
"""One streaming list (a watch with `sendInitialEvents=true`, `resourceVersionMatch=NotOlderThan`,
`allowWatchBookmarks=true`: the API server's WatchList), read until the bookmark that ends the
initial events; each event is read and dropped. Prints the objects received and the seconds from
opening the connection to that bookmark, or `unsupported STATUS` when the server refuses it.

  watchlist.py PATH   (e.g. /api/v1/pods)

Connection settings come from the environment: BENCH_SERVER, BENCH_CA, BENCH_TOKEN.
"""

import http.client
import json
import os
import ssl
import sys
import time
import urllib.parse

END = b'"k8s.io/initial-events-end":"true"'


def main():
    path = sys.argv[1]
    server = urllib.parse.urlparse(os.environ["BENCH_SERVER"])
    ctx = ssl.create_default_context(cafile=os.environ["BENCH_CA"])
    t0 = time.perf_counter()
    conn = http.client.HTTPSConnection(server.hostname, server.port, context=ctx, timeout=300)
    headers = {"Authorization": "Bearer " + os.environ["BENCH_TOKEN"], "Accept": "application/json",
               "User-Agent": "bouncer-bench-floor"}
    q = "?watch=1&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true"
    conn.request("GET", path + q, headers=headers)
    resp = conn.getresponse()
    if resp.status != 200:
        body = resp.read(300).decode(errors="replace")
        print("unsupported", resp.status, json.dumps(body))
        return
    objects = 0
    while True:
        line = resp.readline()
        if not line:
            sys.exit(f"watchlist.py: {path}: the watch ended before the initial events did")
        if line.startswith(b'{"type":"BOOKMARK"') and END in line:
            break
        objects += 1
    print(objects, f"{time.perf_counter() - t0:.6f}")
    conn.close()


if __name__ == "__main__":
    main()
