#!/usr/bin/env python3
"""One LIST read page by page, as bouncer reads it (limit=PAGE, following `continue`), on one
keep-alive connection; each page is read whole and dropped. The `continue` token sits in the list
metadata at the head of the page, so only the first bytes are searched: the client does no parsing
work worth measuring. Prints the number of pages and the seconds from opening the connection to
the last page (the interpreter's own start is left out: curl's is a few milliseconds).

  paged.py PATH PAGE   (e.g. /api/v1/pods 5000)

Connection settings come from the environment: BENCH_SERVER, BENCH_CA, BENCH_TOKEN.
"""

import http.client
import os
import re
import ssl
import sys
import time
import urllib.parse

CONTINUE = re.compile(rb'"continue":"([^"]*)"')


def main():
    path, page = sys.argv[1], int(sys.argv[2])
    server = urllib.parse.urlparse(os.environ["BENCH_SERVER"])
    ctx = ssl.create_default_context(cafile=os.environ["BENCH_CA"])
    t0 = time.perf_counter()
    conn = http.client.HTTPSConnection(server.hostname, server.port,
                                       context=ctx, timeout=300)
    headers = {"Authorization": "Bearer " + os.environ["BENCH_TOKEN"], "Accept": "application/json",
               "User-Agent": "bouncer-bench-floor"}
    cont, pages = "", 0
    while True:
        q = f"?limit={page}" + (f"&continue={urllib.parse.quote(cont)}" if cont else "")
        conn.request("GET", path + q, headers=headers)
        resp = conn.getresponse()
        body = resp.read()
        if resp.status != 200:
            sys.exit(f"paged.py: GET {path}{q}: HTTP {resp.status}: {body[:300].decode(errors='replace')}")
        pages += 1
        m = CONTINUE.search(body, 0, 4096)
        cont = m.group(1).decode() if m else ""
        if not cont:
            break
    print(pages, f"{time.perf_counter() - t0:.6f}")


if __name__ == "__main__":
    main()
