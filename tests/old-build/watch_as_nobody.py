#!/usr/bin/python3
"""Run as the unprivileged local user `nobody`: walk ROOT every ~2 ms until STOPFILE exists,
and copy every file that can be read and whose name says it holds a secret into LOOT.
Prints one line per distinct (path, content) captured."""
import os, sys, time, hashlib
root, loot, stopfile = sys.argv[1], sys.argv[2], sys.argv[3]
SECRET = lambda n: (n.endswith('.key') or 'password' in n or 'pwfile' in n or n.endswith('.toml')
                    or n.endswith('.log') or n.endswith('.credential') or n.endswith('.json'))
seen = {}
walks = 0
while not os.path.exists(stopfile):
    walks += 1
    for dirpath, dirnames, filenames in os.walk(root):
        for n in filenames:
            p = os.path.join(dirpath, n)
            if not SECRET(n):
                continue
            try:
                with open(p, 'rb') as f:
                    data = f.read()
            except OSError:
                continue
            h = hashlib.sha256(data).hexdigest()[:12]
            if seen.get(p) != h and data:
                seen[p] = h
                out = os.path.join(loot, p.replace('/', '_'))
                with open(out, 'wb') as f:
                    f.write(data)
                print(f"CAPTURED {p} ({len(data)} bytes, sha {h})", flush=True)
    time.sleep(0.002)
print(f"watcher: {walks} walks", flush=True)
