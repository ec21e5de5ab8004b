-- privmatch: hand-written schema of one party, part 1 of 3: what every modality uses (the
-- party's identity, its pinned peers, consumed enrolment bundles, distributed transactions).
-- The start of the extension's install script (pgrx `bootstrap`); sql/iris.sql and
-- sql/face.sql follow, then the pgrx-generated functions.

-- ---------------------------------------------------------------------------------------------
-- The party's identity: its index and X25519 public key, set by privmatch.init_party(). The
-- secret key is not here: it is in the party's key file (GUC privmatch.key_file), so it is in
-- no WAL record, dump or replica.
-- ---------------------------------------------------------------------------------------------
CREATE TABLE privmatch.party_identity (
    singleton   boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    party_index integer NOT NULL CHECK (party_index BETWEEN 0 AND 2),
    public_key  bytea   NOT NULL CHECK (length(public_key) = 32),
    created_at  timestamptz NOT NULL DEFAULT now()
);

-- Public keys of the other parties, pinned by the operator (fingerprints compared out of band).
CREATE TABLE privmatch.peers (
    party_index integer PRIMARY KEY CHECK (party_index BETWEEN 0 AND 2),
    public_key  bytea   NOT NULL CHECK (length(public_key) = 32),
    pinned_at   timestamptz NOT NULL DEFAULT now()
);

-- Ids of the enrolment bundles this party has opened (iris and face alike): a replayed bundle
-- is refused.
CREATE TABLE privmatch.consumed_bundles (
    bundle_id   bytea PRIMARY KEY CHECK (length(bundle_id) = 16),
    consumed_at timestamptz NOT NULL DEFAULT now()
);

-- One row per distributed (two-phase) transaction this party took part in, written inside that
-- transaction. Its presence at P0, the first party committed, is the commit decision that
-- recovery of in-doubt prepared transactions follows (see core/src/twophase.rs and
-- coordinator/src/txn/recovery.rs).
--
-- A row with aborted = true is a fence written by recovery at P0 (privmatch.txn_fence): the
-- transaction was decided aborted while no coordinator held it open at P0, so no coordinator
-- can commit it there afterwards.
CREATE TABLE privmatch.distributed_transactions (
    gid        text PRIMARY KEY,
    started_at timestamptz NOT NULL DEFAULT now(),
    aborted    boolean NOT NULL DEFAULT false
);

-- The public half of the party operator's Ed25519 key, set by the operator with
-- privmatch.set_operator_key(), and the highest counter of an operator command accepted so
-- far. Changes of security state that the coordinator relays (the face dealer's
-- configuration) must be signed by this key with a higher counter (core/src/crypto/sign.rs).
CREATE TABLE privmatch.operator_key (
    singleton    boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    public_key   bytea   NOT NULL CHECK (length(public_key) = 32),
    last_counter bigint  NOT NULL DEFAULT 0 CHECK (last_counter >= 0),
    set_at       timestamptz NOT NULL DEFAULT now()
);

-- Query budgets (docs/trust-model.md §4): how many searches or verifications this party
-- answers per hour, kept and enforced here, whoever calls (the coordinator's role included),
-- so that no caller can measure a distance or a threshold by asking again and again. The
-- operator sets them (privmatch.set_query_budget); a request past its budget is refused with
-- 53400 before any work. Kinds:
--   iris-search    iris identifications and uniqueness checks started at this party
--   face-identify  face 1:N identifications opened at this evaluator
--   face-verify    face 1:1 verifications opened at this evaluator, per verified subject
CREATE TABLE privmatch.query_budget_policy (
    kind     text    PRIMARY KEY CHECK (kind IN ('iris-search', 'face-identify', 'face-verify')),
    per_hour integer NOT NULL CHECK (per_hour >= 0),
    set_at   timestamptz NOT NULL DEFAULT now()
);
INSERT INTO privmatch.query_budget_policy (kind, per_hour) VALUES
    ('iris-search', 100000), ('face-identify', 100000), ('face-verify', 60);
REVOKE ALL ON privmatch.query_budget_policy FROM PUBLIC;

-- What each budget used in each hour (key: the verified subject for face-verify, '' for the
-- party-wide kinds). Logged, so a restart does not refill a budget; not dumped.
CREATE TABLE privmatch.query_budget_use (
    kind text        NOT NULL,
    key  text        NOT NULL,
    hour timestamptz NOT NULL,
    used integer     NOT NULL CHECK (used > 0),
    PRIMARY KEY (kind, key, hour)
);
REVOKE ALL ON privmatch.query_budget_use FROM PUBLIC;
