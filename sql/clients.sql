-- privmatch: registered clients at one party (issue 34 item 4; docs/trust-model.md §4a, §5;
-- extension/src/clients.rs, core/src/crypto/client_auth.rs). The clients whose signatures
-- this party accepts on sealed inputs, the nonces it accepted, what each client used of its
-- budget, and the policy for unsigned inputs. Every table belongs to the owner and is written
-- only by the extension's functions: registering, revoking and the policy come from the
-- party's operator as operator-signed commands (client_register, client_revoke,
-- client_auth_set_policy), which the coordinator may relay but not forge.

-- The registered clients: an id (what inputs name), its Ed25519 public key, the requests it
-- may make per hour of each budget kind at this party (on top of the party-wide budgets of
-- query_budget_policy), when its key was registered, and when it was revoked (NULL: active).
-- Dumped, so a restored party keeps its clients and revocations.
CREATE TABLE privmatch.registered_clients (
    client_id     text        PRIMARY KEY
                  CHECK (client_id ~ '^[A-Za-z0-9][A-Za-z0-9._@-]{0,63}$'),
    public_key    bytea       NOT NULL CHECK (length(public_key) = 32),
    per_hour      integer     NOT NULL CHECK (per_hour >= 0),
    registered_at timestamptz NOT NULL DEFAULT now(),
    revoked_at    timestamptz
);
REVOKE ALL ON privmatch.registered_clients FROM PUBLIC;

-- The nonces of the signed inputs accepted here, each kept until its input would be refused
-- as expired anyway (its expiry plus the clock skew allowed; at most 11 minutes): a replayed
-- input is refused. Swept as inputs are admitted. Not dumped (a party restored from a dump
-- forgets them; the inputs' expiry bounds that replay window to their lifetime).
CREATE TABLE privmatch.client_nonces (
    client_id  text        NOT NULL,
    nonce      bytea       NOT NULL CHECK (length(nonce) = 16),
    keep_until timestamptz NOT NULL,
    PRIMARY KEY (client_id, nonce)
);
CREATE INDEX client_nonces_keep_until ON privmatch.client_nonces (keep_until);
REVOKE ALL ON privmatch.client_nonces FROM PUBLIC;

-- What each client used of each budget kind in each hour. Logged, so a restart does not
-- refill a client's budget; not dumped.
CREATE TABLE privmatch.client_budget_use (
    client_id text        NOT NULL,
    kind      text        NOT NULL,
    hour      timestamptz NOT NULL,
    used      integer     NOT NULL CHECK (used > 0),
    PRIMARY KEY (client_id, kind, hour)
);
REVOKE ALL ON privmatch.client_budget_use FROM PUBLIC;

-- The client-auth policy (at most one row; none = 'optional', the install default):
-- 'optional' accepts unsigned sealed inputs (of clients older than 0.12.0), 'required'
-- refuses them. Signed inputs are verified under either. Deployments set 'required' once
-- their clients are registered (docs/deployment.md). Dumped.
CREATE TABLE privmatch.client_auth_policy (
    singleton boolean     PRIMARY KEY DEFAULT true CHECK (singleton),
    mode      text        NOT NULL CHECK (mode IN ('optional', 'required')),
    set_at    timestamptz NOT NULL DEFAULT now()
);
REVOKE ALL ON privmatch.client_auth_policy FROM PUBLIC;

SELECT pg_catalog.pg_extension_config_dump('privmatch.registered_clients', '');
SELECT pg_catalog.pg_extension_config_dump('privmatch.client_auth_policy', '');
