-- A party's identity: init_party, party_info, pin_peer. The generated key is random, so only
-- its shape and its stability are shown, never the key itself.
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS privmatch;
RESET client_min_messages;

-- Before init_party: no identity (55000), and nothing can be pinned.
SELECT * FROM privmatch.party_info();
SELECT :'LAST_ERROR_SQLSTATE' AS sqlstate;
SELECT privmatch.pin_peer(0, repeat('ab', 32));
SELECT :'LAST_ERROR_SQLSTATE' AS sqlstate;

-- Party indexes are 0, 1, 2 (22023).
SELECT privmatch.init_party(3);
SELECT :'LAST_ERROR_SQLSTATE' AS sqlstate, count(*) FROM privmatch.party_identity;
SELECT privmatch.init_party(-1);
SELECT :'LAST_ERROR_SQLSTATE' AS sqlstate, count(*) FROM privmatch.party_identity;

-- init_party(1) returns the new public key: 64 lower-case hex digits.
SELECT privmatch.init_party(1) AS key \gset
SELECT length(:'key') AS length, :'key' ~ '^[0-9a-f]{64}$' AS is_hex;
-- Again with the same index: the same key, no new row.
SELECT privmatch.init_party(1) = :'key' AS same_key;
-- With another index: refused (55000), the identity is unchanged.
SELECT privmatch.init_party(2);
SELECT :'LAST_ERROR_SQLSTATE' AS sqlstate;
SELECT party_index, public_key = decode(:'key', 'hex') AS same_key FROM privmatch.party_identity;
-- party_info: the index, the key, and its fingerprint (the first 16 bytes of its SHA-256).
SELECT party_index,
       public_key = :'key' AS same_key,
       fingerprint = encode(substr(sha256(decode(:'key', 'hex')), 1, 16), 'hex') AS fingerprint_ok
FROM privmatch.party_info();

-- pin_peer: refused for this party itself, an index out of range, or a key that is not
-- 32 bytes of hex (22023); nothing is pinned.
SELECT privmatch.pin_peer(1, repeat('ab', 32));
SELECT :'LAST_ERROR_SQLSTATE' AS sqlstate;
SELECT privmatch.pin_peer(3, repeat('ab', 32));
SELECT :'LAST_ERROR_SQLSTATE' AS sqlstate;
SELECT privmatch.pin_peer(0, repeat('zz', 32));
SELECT :'LAST_ERROR_SQLSTATE' AS sqlstate;
SELECT privmatch.pin_peer(0, repeat('ab', 31));
SELECT :'LAST_ERROR_SQLSTATE' AS sqlstate, count(*) FROM privmatch.peers;

-- Pinning returns the key's fingerprint; pinning the same key again is a no-op.
SELECT privmatch.pin_peer(0, repeat('ab', 32));
SELECT privmatch.pin_peer(0, upper(repeat('ab', 32)));
-- A different key for P0 needs replace => true (23505 without it, the old key stays).
SELECT privmatch.pin_peer(0, repeat('cd', 32));
SELECT :'LAST_ERROR_SQLSTATE' AS sqlstate;
SELECT party_index, encode(public_key, 'hex') FROM privmatch.peers;
SELECT privmatch.pin_peer(0, repeat('cd', 32), replace => true);
SELECT privmatch.pin_peer(2, repeat('ef', 32));
SELECT party_index, encode(public_key, 'hex') FROM privmatch.peers ORDER BY 1;
