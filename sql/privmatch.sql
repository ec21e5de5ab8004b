-- privmatch: hand-written schema of one party (types, tables, casts).
-- Included at the start of the extension's install script; the pgrx-generated functions follow.

-- ---------------------------------------------------------------------------------------------
-- Share types. Payload layout and text form: see core/src/storage.rs. Both are fixed and
-- versioned; every input path (text, binary recv, typmod coercion) re-validates.
-- ---------------------------------------------------------------------------------------------
CREATE TYPE privmatch.iris_code_share;
CREATE FUNCTION privmatch.iris_code_share_in(cstring, oid, integer) RETURNS privmatch.iris_code_share
    IMMUTABLE STRICT PARALLEL SAFE LANGUAGE c AS 'MODULE_PATHNAME', 'iris_code_share_in';
CREATE FUNCTION privmatch.iris_code_share_out(privmatch.iris_code_share) RETURNS cstring
    IMMUTABLE STRICT PARALLEL SAFE LANGUAGE c AS 'MODULE_PATHNAME', 'iris_code_share_out';
CREATE FUNCTION privmatch.iris_code_share_recv(internal, oid, integer) RETURNS privmatch.iris_code_share
    IMMUTABLE STRICT PARALLEL SAFE LANGUAGE c AS 'MODULE_PATHNAME', 'iris_code_share_recv';
CREATE FUNCTION privmatch.iris_code_share_send(privmatch.iris_code_share) RETURNS bytea
    IMMUTABLE STRICT PARALLEL SAFE LANGUAGE c AS 'MODULE_PATHNAME', 'iris_code_share_send';
CREATE FUNCTION privmatch.iris_code_share_typmod_in(cstring[]) RETURNS integer
    IMMUTABLE STRICT PARALLEL SAFE LANGUAGE c AS 'MODULE_PATHNAME', 'iris_code_share_typmod_in';
CREATE FUNCTION privmatch.iris_code_share_typmod_out(integer) RETURNS cstring
    IMMUTABLE STRICT PARALLEL SAFE LANGUAGE c AS 'MODULE_PATHNAME', 'iris_code_share_typmod_out';
CREATE TYPE privmatch.iris_code_share (
    INPUT = privmatch.iris_code_share_in,
    OUTPUT = privmatch.iris_code_share_out,
    RECEIVE = privmatch.iris_code_share_recv,
    SEND = privmatch.iris_code_share_send,
    TYPMOD_IN = privmatch.iris_code_share_typmod_in,
    TYPMOD_OUT = privmatch.iris_code_share_typmod_out,
    INTERNALLENGTH = VARIABLE,
    ALIGNMENT = int4,
    STORAGE = external
);
CREATE FUNCTION privmatch.iris_code_share(privmatch.iris_code_share, integer, boolean)
    RETURNS privmatch.iris_code_share
    IMMUTABLE STRICT PARALLEL SAFE LANGUAGE c AS 'MODULE_PATHNAME', 'iris_code_share_apply_typmod';
CREATE CAST (privmatch.iris_code_share AS privmatch.iris_code_share)
    WITH FUNCTION privmatch.iris_code_share(privmatch.iris_code_share, integer, boolean) AS IMPLICIT;
COMMENT ON TYPE privmatch.iris_code_share IS
    'One party''s degree-1 Shamir share over GR(2^16,4) of an encoded iris code (mask - 2*(code AND mask)); length = number of Z_2^16 coefficients';

CREATE TYPE privmatch.iris_mask_share;
CREATE FUNCTION privmatch.iris_mask_share_in(cstring, oid, integer) RETURNS privmatch.iris_mask_share
    IMMUTABLE STRICT PARALLEL SAFE LANGUAGE c AS 'MODULE_PATHNAME', 'iris_mask_share_in';
CREATE FUNCTION privmatch.iris_mask_share_out(privmatch.iris_mask_share) RETURNS cstring
    IMMUTABLE STRICT PARALLEL SAFE LANGUAGE c AS 'MODULE_PATHNAME', 'iris_mask_share_out';
CREATE FUNCTION privmatch.iris_mask_share_recv(internal, oid, integer) RETURNS privmatch.iris_mask_share
    IMMUTABLE STRICT PARALLEL SAFE LANGUAGE c AS 'MODULE_PATHNAME', 'iris_mask_share_recv';
CREATE FUNCTION privmatch.iris_mask_share_send(privmatch.iris_mask_share) RETURNS bytea
    IMMUTABLE STRICT PARALLEL SAFE LANGUAGE c AS 'MODULE_PATHNAME', 'iris_mask_share_send';
CREATE FUNCTION privmatch.iris_mask_share_typmod_in(cstring[]) RETURNS integer
    IMMUTABLE STRICT PARALLEL SAFE LANGUAGE c AS 'MODULE_PATHNAME', 'iris_mask_share_typmod_in';
CREATE FUNCTION privmatch.iris_mask_share_typmod_out(integer) RETURNS cstring
    IMMUTABLE STRICT PARALLEL SAFE LANGUAGE c AS 'MODULE_PATHNAME', 'iris_mask_share_typmod_out';
CREATE TYPE privmatch.iris_mask_share (
    INPUT = privmatch.iris_mask_share_in,
    OUTPUT = privmatch.iris_mask_share_out,
    RECEIVE = privmatch.iris_mask_share_recv,
    SEND = privmatch.iris_mask_share_send,
    TYPMOD_IN = privmatch.iris_mask_share_typmod_in,
    TYPMOD_OUT = privmatch.iris_mask_share_typmod_out,
    INTERNALLENGTH = VARIABLE,
    ALIGNMENT = int4,
    STORAGE = external
);
CREATE FUNCTION privmatch.iris_mask_share(privmatch.iris_mask_share, integer, boolean)
    RETURNS privmatch.iris_mask_share
    IMMUTABLE STRICT PARALLEL SAFE LANGUAGE c AS 'MODULE_PATHNAME', 'iris_mask_share_apply_typmod';
CREATE CAST (privmatch.iris_mask_share AS privmatch.iris_mask_share)
    WITH FUNCTION privmatch.iris_mask_share(privmatch.iris_mask_share, integer, boolean) AS IMPLICIT;
COMMENT ON TYPE privmatch.iris_mask_share IS
    'One party''s degree-1 Shamir share over GR(2^16,4) of an iris mask (real parts only); length = number of Z_2^16 coefficients';

CREATE TYPE privmatch.eye AS ENUM ('left', 'right');

-- ---------------------------------------------------------------------------------------------
-- The party's identity: its index and X25519 key pair, generated inside the party by
-- privmatch.init_party(). The secret key is readable by no role but the owner; no function
-- returns it.
-- ---------------------------------------------------------------------------------------------
CREATE TABLE privmatch.party_identity (
    singleton   boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    party_index integer NOT NULL CHECK (party_index BETWEEN 0 AND 2),
    public_key  bytea   NOT NULL CHECK (length(public_key) = 32),
    secret_key  bytea   NOT NULL CHECK (length(secret_key) = 32),
    created_at  timestamptz NOT NULL DEFAULT now()
);
REVOKE ALL ON privmatch.party_identity FROM PUBLIC;

-- Public keys of the other parties, pinned by the operator (fingerprints compared out of band).
CREATE TABLE privmatch.peers (
    party_index integer PRIMARY KEY CHECK (party_index BETWEEN 0 AND 2),
    public_key  bytea   NOT NULL CHECK (length(public_key) = 32),
    pinned_at   timestamptz NOT NULL DEFAULT now()
);

-- ---------------------------------------------------------------------------------------------
-- Enrolled iris templates (this party's shares). Source of truth for the matching engine.
-- ---------------------------------------------------------------------------------------------
CREATE TABLE privmatch.iris_templates (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    subject     text NOT NULL CHECK (length(subject) BETWEEN 1 AND 256),
    eye         privmatch.eye NOT NULL,
    code_share  privmatch.iris_code_share(12800) NOT NULL,
    mask_share  privmatch.iris_mask_share(6400) NOT NULL,
    enrolled_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT iris_templates_subject_eye_key UNIQUE (subject, eye)
);

-- Ids of the enrolment bundles this party has opened: a replayed bundle is refused.
CREATE TABLE privmatch.consumed_bundles (
    bundle_id   bytea PRIMARY KEY CHECK (length(bundle_id) = 16),
    consumed_at timestamptz NOT NULL DEFAULT now()
);

-- One row per distributed (two-phase) transaction this party took part in, written inside that
-- transaction. Its presence at P0, the first party committed, is the commit decision that
-- recovery of in-doubt prepared transactions follows (see coordinator/src/twophase.rs).
CREATE TABLE privmatch.distributed_transactions (
    gid        text PRIMARY KEY,
    started_at timestamptz NOT NULL DEFAULT now()
);

-- ---------------------------------------------------------------------------------------------
-- Face templates (Funshade, seed 000). P0 and P1 hold additive Z_2^32 shares of each quantised
-- embedding (type face_share, typmod = dimension) and of its squared norm; P2 holds none.
-- Layout and text form: core/src/storage.rs (kind 3) and core/src/face.
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

-- The dealer's configuration (P2 only): metric, dimension and the secret threshold. Readable
-- by no role but the owner; no function returns the threshold.
CREATE TABLE privmatch.face_dealer (
    singleton     boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    metric        text    NOT NULL CHECK (metric IN ('cosine', 'euclidean')),
    dim           integer NOT NULL CHECK (dim BETWEEN 128 AND 1024),
    threshold     float8  NOT NULL,
    generation    bigint  NOT NULL CHECK (generation > 0),
    next_batch    bigint  NOT NULL DEFAULT 1 CHECK (next_batch > 0),
    configured_at timestamptz NOT NULL DEFAULT now()
);
REVOKE ALL ON privmatch.face_dealer FROM PUBLIC;

-- Single-use key material dealt by P2 (P0 and P1). A batch's keys are claimed in ranges;
-- keys below next_key are claimed (or retired) and are never handed out again. The claims
-- table's exclusion constraint makes a second claim of any key impossible, whatever the
-- code above it does.
CREATE TABLE privmatch.face_key_batches (
    batch       bigint  PRIMARY KEY CHECK (batch > 0 AND batch < 549755813888),
    generation  bigint  NOT NULL,
    metric      text    NOT NULL CHECK (metric IN ('cosine', 'euclidean')),
    dim         integer NOT NULL CHECK (dim BETWEEN 128 AND 1024),
    key_count   integer NOT NULL CHECK (key_count > 0 AND key_count < 16777216),
    key_len     integer NOT NULL CHECK (key_len > 0),
    next_key    integer NOT NULL DEFAULT 0,
    keys        bytea   NOT NULL,
    received_at timestamptz NOT NULL DEFAULT now(),
    CHECK (next_key BETWEEN 0 AND key_count)
);
ALTER TABLE privmatch.face_key_batches ALTER COLUMN keys SET STORAGE EXTERNAL;
REVOKE ALL ON privmatch.face_key_batches FROM PUBLIC;

CREATE TABLE privmatch.face_key_claims (
    batch      bigint  NOT NULL,
    first_key  integer NOT NULL CHECK (first_key >= 0),
    key_count  integer NOT NULL CHECK (key_count > 0 AND first_key + key_count <= 16777216),
    session    bytea   NOT NULL,
    claimed_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT face_key_claims_no_reuse EXCLUDE USING gist (
        int8range(batch * 16777216 + first_key, batch * 16777216 + first_key + key_count) WITH &&)
);
CREATE INDEX face_key_claims_session ON privmatch.face_key_claims (session);

-- Face comparison sessions (P0 and P1). A session's keys are claimed when it opens and are
-- bound to it; the compared template ids and the sealed probe are fixed then too, so a round
-- re-run after a crash recomputes exactly the same values and nothing is ever evaluated
-- twice on different inputs with the same keys.
CREATE TABLE privmatch.face_sessions (
    session      bytea   PRIMARY KEY CHECK (length(session) = 16),
    metric       text    NOT NULL,
    dim          integer NOT NULL,
    template_ids bigint[] NOT NULL,
    set_digest   bytea   NOT NULL,
    claims       bytea   NOT NULL,
    probe        bytea,
    -- The verified subject (NULL: identification); the probe was sealed for it.
    target       text,
    round        integer NOT NULL DEFAULT 0 CHECK (round BETWEEN 0 AND 3),
    z_share      bytea,
    aborted      boolean NOT NULL DEFAULT false,
    started_at   timestamptz NOT NULL DEFAULT now(),
    finished_at  timestamptz
);

-- The pool level as this party sees it.
CREATE VIEW privmatch.face_key_pool AS
    SELECT metric, dim, generation,
           sum(key_count - next_key)::bigint AS available,
           count(*) FILTER (WHERE next_key < key_count)::bigint AS batches
      FROM privmatch.face_key_batches
     GROUP BY metric, dim, generation;
