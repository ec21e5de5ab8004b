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
