"""Paillier interoperability with python-paillier (`phe`).

privmatch's Paillier (core/src/paillier/cipher.rs) uses g = N + 1, like `phe`. For a key made
by `phe` and the same plaintext m and nonce r, both must produce the same ciphertext integer
(privmatch by the public-key path and by the key owner's CRT path), and ciphertexts made by
`phe` must decrypt under privmatch. Run by scripts/test.sh:

    python3 tests/python/test_phe_interop.py PATH/TO/paillier_interop
"""

import json
import random
import subprocess
import sys

import phe
from phe import paillier


def main(driver):
    rng = random.Random(20201363)
    for n_length in (1024, 2048, 3072):
        public, private = paillier.generate_paillier_keypair(n_length=n_length)
        n = public.n
        assert public.g == n + 1, "phe uses g = N + 1"
        cases = []
        for m in (0, 1, 2, n - 1, n // 2, n // 2 + 1):
            cases.append((m, rng.randrange(1, n)))
        for _ in range(20):
            cases.append((rng.randrange(0, n), rng.randrange(1, n)))
        expected = [public.raw_encrypt(m, r_value=r) for m, r in cases]
        made_by_phe = [(public.raw_encrypt(m), m) for m in (0, 1, n - 1, 42, rng.randrange(0, n))]
        request = {
            "p": str(private.p),
            "q": str(private.q),
            "encrypt": [{"m": str(m), "r": str(r)} for m, r in cases],
            "decrypt": [str(c) for c, _ in made_by_phe],
        }
        out = subprocess.run([driver], input=json.dumps(request), capture_output=True,
                             text=True, check=True)
        answer = json.loads(out.stdout)
        assert int(answer["n"]) == n, "same modulus"
        for i, (want, got, owner) in enumerate(zip(expected, answer["ciphertexts"],
                                                   answer["owner_ciphertexts"])):
            assert int(got) == want, f"case {i}: public-key ciphertext differs from phe's"
            assert int(owner) == want, f"case {i}: owner (CRT) ciphertext differs from phe's"
            width = (2 * n.bit_length() + 7) // 8
            assert int(got).to_bytes(width, "big") == want.to_bytes(width, "big")
        for (c, m), got in zip(made_by_phe, answer["plaintexts"]):
            assert int(got) == m, "a phe ciphertext decrypts under privmatch"
            assert private.raw_decrypt(c) == m
        print(f"phe {phe.__version__} interop ok: {n_length}-bit N, {len(cases)} encryptions "
              f"byte-identical, {len(made_by_phe)} phe ciphertexts decrypted")


if __name__ == "__main__":
    main(sys.argv[1])
