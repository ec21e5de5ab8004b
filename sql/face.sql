-- privmatch: hand-written schema of one party, part 3 of 3: the face modality (share type,
-- enrolled templates, the dealer's configuration, the opened templates, comparison
-- sessions). Runs after sql/common.sql.

-- ---------------------------------------------------------------------------------------------
-- Face templates (Funshade, ePrint 2022/1688). P0 and P1 hold additive Z_2^32 shares of each quantised
-- embedding (type face_share, typmod = dimension) and of its squared norm; P2 holds none.
-- Layout and text form: core/src/wire/storage.rs (kind 3) and core/src/face; the C functions
-- are in extension/src/face/types.rs.
-- ---------------------------------------------------------------------------------------------
CREATE TYPE privmatch.face_share;
CREATE FUNCTION privmatch.face_share_in(cstring, oid, integer) RETURNS privmatch.face_share
    IMMUTABLE STRICT PARALLEL SAFE LANGUAGE c AS 'MODULE_PATHNAME', 'face_share_in';
CREATE FUNCTION privmatch.face_share_out(privmatch.face_share) RETURNS cstring
    IMMUTABLE STRICT PARALLEL SAFE LANGUAGE c AS 'MODULE_PATHNAME', 'face_share_out';
CREATE FUNCTION privmatch.face_share_recv(internal, oid, integer) RETURNS privmatch.face_share
    IMMUTABLE STRICT PARALLEL SAFE LANGUAGE c AS 'MODULE_PATHNAME', 'face_share_recv';
CREATE FUNCTION privmatch.face_share_send(privmatch.face_share) RETURNS bytea
    IMMUTABLE STRICT PARALLEL SAFE LANGUAGE c AS 'MODULE_PATHNAME', 'face_share_send';
CREATE FUNCTION privmatch.face_share_typmod_in(cstring[]) RETURNS integer
    IMMUTABLE STRICT PARALLEL SAFE LANGUAGE c AS 'MODULE_PATHNAME', 'face_share_typmod_in';
CREATE FUNCTION privmatch.face_share_typmod_out(integer) RETURNS cstring
    IMMUTABLE STRICT PARALLEL SAFE LANGUAGE c AS 'MODULE_PATHNAME', 'face_share_typmod_out';
CREATE TYPE privmatch.face_share (
    INPUT = privmatch.face_share_in,
    OUTPUT = privmatch.face_share_out,
    RECEIVE = privmatch.face_share_recv,
    SEND = privmatch.face_share_send,
    TYPMOD_IN = privmatch.face_share_typmod_in,
    TYPMOD_OUT = privmatch.face_share_typmod_out,
    INTERNALLENGTH = VARIABLE,
    ALIGNMENT = int4,
    STORAGE = external
);
CREATE FUNCTION privmatch.face_share(privmatch.face_share, integer, boolean)
    RETURNS privmatch.face_share
    IMMUTABLE STRICT PARALLEL SAFE LANGUAGE c AS 'MODULE_PATHNAME', 'face_share_apply_typmod';
CREATE CAST (privmatch.face_share AS privmatch.face_share)
    WITH FUNCTION privmatch.face_share(privmatch.face_share, integer, boolean) AS IMPLICIT;
CREATE FUNCTION privmatch.face_share_dim(privmatch.face_share) RETURNS integer
    IMMUTABLE STRICT PARALLEL SAFE LANGUAGE c AS 'MODULE_PATHNAME', 'face_share_dim';
COMMENT ON TYPE privmatch.face_share IS
    'One evaluator''s additive Z_2^32 share of a quantised face embedding; length = dimension';

CREATE TABLE privmatch.face_templates (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    subject     text NOT NULL UNIQUE CHECK (length(subject) BETWEEN 1 AND 256),
    template    privmatch.face_share NOT NULL,
    -- This party's share of the squared norm of the quantised embedding (u32 bits as int4).
    norm_share  integer NOT NULL,
    -- The enrolment's bundle id (the same at P0 and P1): ties the two halves together.
    bundle_id   bytea   NOT NULL CHECK (length(bundle_id) = 16),
    enrolled_at timestamptz NOT NULL DEFAULT now()
);

-- Looked up by bundle id: the opening, the engine's loads and the replay guard's neighbours.
CREATE INDEX face_templates_bundle_id ON privmatch.face_templates (bundle_id);

-- The dealer's configuration (P2 only): metric, dimension and the secret threshold, sealed
-- under the party's at-rest key (core's crypto::at_rest, derived from the key file), so that
-- θ is in no WAL record, physical backup or replica in the clear. Readable by no role but the
-- owner; no function returns the threshold.
CREATE TABLE privmatch.face_dealer (
    singleton     boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    metric        text    NOT NULL CHECK (metric IN ('cosine', 'euclidean')),
    dim           integer NOT NULL CHECK (dim BETWEEN 128 AND 1024),
    threshold_sealed bytea NOT NULL,
    generation    bigint  NOT NULL CHECK (generation > 0),
    configured_at timestamptz NOT NULL DEFAULT now()
);
REVOKE ALL ON privmatch.face_dealer FROM PUBLIC;

-- The dealer's template-mask master key K (P2 only; docs/protocols/face.md §5): each enrolled
-- template's mask seeds are HKDF-SHA256(K; bundle id), so K unmasks every opened template
-- Δy = y + δy that P0 and P1 hold. Drawn once, when the dealer is first configured, and kept
-- across reconfigurations (the evaluators' opened templates stay valid). Readable by no role
-- but the owner; no function returns it; not dumped (a restored P2 draws a new K and the
-- evaluators open their templates again under it). Stored sealed under the party's at-rest
-- key (32 bytes of K, 45 of sealing), like θ.
CREATE TABLE privmatch.face_template_master (
    singleton  boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    master_key_sealed bytea NOT NULL CHECK (length(master_key_sealed) = 77),
    created_at timestamptz NOT NULL DEFAULT now()
);
REVOKE ALL ON privmatch.face_template_master FROM PUBLIC;

-- Face comparison sessions (P0 and P1; docs/protocols/face.md §10). A session's row is committed
-- when it opens, before anything derived from its keys leaves the party: its id is single-use
-- (the primary key), whatever the coordinator replays. Its secrets (keys, probe share) live in
-- the engine, which runs its steps in order; round is 3 once it finished. masked is false only
-- for sessions of the face key pool retired in 0.13.0 (kept as history; none can run).
CREATE TABLE privmatch.face_sessions (
    session      bytea   PRIMARY KEY CHECK (length(session) = 16),
    dim          integer NOT NULL,
    set_digest   bytea   NOT NULL,
    -- The verified subject (NULL: identification); the probe was sealed for it.
    target       text,
    round        integer NOT NULL DEFAULT 0 CHECK (round BETWEEN 0 AND 3),
    aborted      boolean NOT NULL DEFAULT false,
    started_at   timestamptz NOT NULL DEFAULT now(),
    finished_at  timestamptz,
    masked       boolean NOT NULL DEFAULT true
);

-- The evaluator's opened templates (P0 and P1; docs/protocols/face.md §6 step 1): per
-- enrolled template, once opened, Δy = y + δy (4·l bytes, little-endian u32) and this party's
-- mask seed (δy_b's, 16 bytes). Δy is a one-time pad of y under δy_{1−b}, which this party
-- never learns; P2 alone can unmask it. Readable by no role but the owner; the engine loads it.
-- Not dumped: a restored party opens its templates again.
CREATE TABLE privmatch.face_masked_templates (
    bundle_id  bytea PRIMARY KEY CHECK (length(bundle_id) = 16),
    masked     bytea NOT NULL,
    seed       bytea NOT NULL CHECK (length(seed) = 16),
    opened_at  timestamptz NOT NULL DEFAULT now()
);
ALTER TABLE privmatch.face_masked_templates ALTER COLUMN masked SET STORAGE EXTERNAL;
REVOKE ALL ON privmatch.face_masked_templates FROM PUBLIC;

-- Dealings stocked ahead of time that a session claimed (P0 and P1; docs/protocols/face.md
-- §11). The dealing's keys live in the engine's memory until an identification over its
-- list claims them; the claim is this row, committed with the session before anything derived
-- from the keys leaves, so a stock id serves one session, ever (the primary key), whatever the
-- coordinator replays. Not dumped, like the sessions.
CREATE TABLE privmatch.face_stock_used (
    stock      bytea PRIMARY KEY CHECK (length(stock) = 16),
    session    bytea NOT NULL,
    claimed_at timestamptz NOT NULL DEFAULT now()
);
REVOKE ALL ON privmatch.face_stock_used FROM PUBLIC;

-- The version of this evaluator's template set (P0 and P1; docs/protocols/face.md §12): 128
-- counters, one of which (the changing backend's, by process id) every statement that enrols,
-- opens or deletes a face template bumps (the triggers below, whoever runs the statement, the
-- operator by hand included), in the same transaction as the change and at most once per
-- transaction. The engine reads all of them before an identification's open and re-reads the
-- set only when one moved since its last full refresh: a snapshot that sees the same counters
-- sees no committed change since. Several counters, so that concurrent enrolments (held until
-- COMMIT PREPARED) rarely wait for each other's row. The epoch is drawn when the rows are
-- made, so a re-created extension never repeats an old version. Not dumped: a restore makes a
-- new epoch.
CREATE TABLE privmatch.face_set_version (
    shard   integer PRIMARY KEY CHECK (shard BETWEEN 0 AND 127),
    epoch   uuid    NOT NULL,
    version bigint  NOT NULL DEFAULT 0
);
INSERT INTO privmatch.face_set_version (shard, epoch)
    SELECT s, e.epoch FROM generate_series(0, 127) s, (SELECT gen_random_uuid() AS epoch) e;
REVOKE ALL ON privmatch.face_set_version FROM PUBLIC;

-- Bumps the set version (a statement trigger; runs as the extension's owner, roles.sql): the
-- changing backend's counter, once per transaction (a row version this transaction wrote
-- already, its xmin being this transaction's id, commits with it). Statements in a
-- subtransaction bump again (harmless). Before the statement: the counter's row is locked
-- before the statement takes any row lock of its own (docs/protocols/face.md §12).
CREATE FUNCTION privmatch.face_set_changed() RETURNS trigger
LANGUAGE plpgsql AS $changed$
BEGIN
    UPDATE privmatch.face_set_version SET version = version + 1
     WHERE shard = pg_catalog.pg_backend_pid() % 128
       AND xmin::text::bigint <> pg_catalog.txid_current() % 4294967296;
    RETURN NULL;
END
$changed$;
CREATE TRIGGER face_templates_set_changed
    BEFORE INSERT OR UPDATE OR DELETE OR TRUNCATE ON privmatch.face_templates
    FOR EACH STATEMENT EXECUTE FUNCTION privmatch.face_set_changed();
CREATE TRIGGER face_masked_templates_set_changed
    BEFORE INSERT OR UPDATE OR DELETE OR TRUNCATE ON privmatch.face_masked_templates
    FOR EACH STATEMENT EXECUTE FUNCTION privmatch.face_set_changed();

